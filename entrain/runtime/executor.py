"""Interpret one rank's action list of an ``IterationPlan`` (docs/design.md §3).

The executor knows nothing about the system that made the Plan: it runs the actions in order through
a dispatch table with one small handler per ``ActionKind``. Conventions (``entrain.core.ir.plan``):

* a message is a set of named parts (``StageSpec.part_names``: ``"hidden"`` and what the family
  declares); a stage's input for ``(mb, sub)`` is one leaf tensor (``detach().requires_grad_()``) per
  part received from the previous stage; their ``.grad`` is what ``SEND_B`` returns, part by part;
* a stage module takes the ``"hidden"`` part as ``x``, or every part as a ``dict`` when it sets
  ``takes_parts``; it returns a tensor (the ``"hidden"`` part) or a ``dict`` of parts. A part the
  stage's message declares that the module did not return but received rides along: the stage sends
  it on as it came, and its gradient goes back the same way (added to its input leaf's gradient);
* on the first LLM stage the leaves are *encoder messages* ``(mb, sub)`` of the last encoder stage,
  every part cut into per-sample rows (one row per image feature row, or per audio token for a part
  whose ``MessagePart.rows`` is ``audio_tokens``) and routed by
  sample id to whichever LLM (sub-)microbatch consumes them (deferred samples simply wait there); the
  gradient of a message goes back once the Plan says so;
* with several encoder pipelines (``Layout.encoder_groups``) each pipeline's stages run its tower
  (a pipeline whose output rows are audio tokens reads the samples' audio clips, the others their
  images); the first LLM stage's ``RECV_F`` / ``SEND_B`` stand for one message per pipeline
  (``validate.messages_of``): the messages of ``(mb, sub)`` are merged into one input, each
  pipeline's ``hidden`` under the part name its family gives it (``ModelFamily.encoder_parts``), and
  each gradient goes back to the pipeline it came from;
* neighbouring stages on the same rank hand tensors over locally (with or without comm actions);
* ``I`` computes input gradients only; ``W`` the weight gradients, from the gradients ``I`` saved at
  the nodes where weight paths leave the input paths (``torch.distributed.pipelining``'s
  ``stage_backward_input`` / ``stage_backward_weight``), so ``I + W`` costs one backward. A stage
  without input gradients to send (the first one) runs its whole backward at ``W``.

Loss: the last stage's output is ``sum(token CE) / label tokens of the global batch``; backward of
that scalar makes gradients independent of grouping, deferral and splitting.

Beside this module: the communication actions and the pieces of boundary messages in
``entrain.runtime.executor_comm``, the forward messages' shapes from the plan in
``entrain.runtime.message_shapes``, the errors a failed step raises in ``entrain.runtime.step_errors``.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from entrain.core.errors import ConfigError
from entrain.core.ir.graph import Message
from entrain.core.ir.p2p import (
    Comm,
    Pieces,
    Step,
    WarmUp,
    encoder_pieces,
    rank_program,
)
from entrain.core.ir.plan import Action, ActionKind, IterationPlan, Layout
from entrain.core.model.layer_specs import HIDDEN
from entrain.models.families.registry import family_of
from entrain.runtime.comm import Transport
from entrain.runtime.data import AUDIO_MEL, SampleRenderer
from entrain.runtime.executor_comm import MessagePassing, receive_queues
from entrain.runtime.message_shapes import MessageShapes, Parts
from entrain.runtime.step_errors import ExecutionError, WarmUpError

__all__ = ["Executor", "ComputeRecord", "StepOutput"]

Key = tuple[int, int, int]  # (stage, mb, sub)


def _no_weight_grads() -> None:
    """``W`` of a stage whose ``I`` left no weight gradients (frozen, or no graph)."""


@dataclass(frozen=True, slots=True)
class ComputeRecord:
    stage: int
    kind: str
    mb: int
    sub: int
    ms: float
    cpu_ms: float = 0.0
    """This thread's CPU time of the action (what ``entrain profile`` measures on the CPU)."""


@dataclass
class StepOutput:
    loss_sum: torch.Tensor | float = 0.0
    """Sum of this rank's last-stage loss contributions (already divided by the global label count),
    a float64 scalar tensor on the rank's device."""
    records: list[ComputeRecord] = field(default_factory=list)


class Executor(MessagePassing):
    """Runs action lists for the stages one rank holds (several stage chunks are fine)."""

    def __init__(
        self,
        *,
        layout: Layout,
        rank: int,
        modules: dict[int, nn.Module],
        transport: Transport,
        renderer: SampleRenderer,
        input_grad: dict[int, bool],
        autocast: Callable[[], AbstractContextManager] | None = None,
        process_rank: Callable[[int], int] | None = None,
        cross_replica: bool = False,
    ):
        self.layout, self.rank, self.modules = layout, rank, modules
        self._is_encoder = {st.stage: st.component == "encoder" for st in layout.stages}
        self._next = {st.stage: layout.next_stage(st.stage) for st in layout.stages}
        self._prev = {st.stage: layout.prev_stages(st.stage) for st in layout.stages}
        """Each stage's neighbours (``Layout.next_stage`` / ``prev_stages``): one chain, or each encoder
        pipeline's into the first LLM stage."""
        rows = _encoder_rows(layout, renderer)
        self._renames = {
            g[-1]: {HIDDEN: rows[layout.stages[g[-1]].encoder][0]} for g in layout.encoder_groups if rows
        }
        """With several encoder pipelines: per pipeline's last stage, the name its message's parts take in
        the first LLM stage's input (``ModelFamily.encoder_parts``)."""
        self._audio_stages = frozenset(
            st.stage
            for st in layout.stages
            if st.encoder is not None and rows[st.encoder][1] == "audio_tokens"
        )
        """The stages of an encoder pipeline whose output rows are audio tokens: they read audio clips."""
        self.replica, self.pp_rank = layout.replica_of(rank)
        self.transport, self.renderer = transport, renderer
        self.input_grad = input_grad
        """Per stage: whether its input needs a gradient (something upstream trains)."""
        self.autocast = autocast or nullcontext
        self.tracer = None
        """An ``entrain.runtime.trace.ActionTracer`` (``--trace``): times every action run."""
        self.device = transport.device
        self.process_rank = process_rank or (lambda r: r)
        """Process rank of a plan rank (they differ under TP), for error messages."""
        self.first_llm = layout.num_encoder_stages
        self.last_stage = len(layout.stages) - 1
        self._audio_parts = frozenset(
            p.name for st in layout.stages for p in st.parts if p.rows == "audio_tokens"
        ) | {part for part, rule in rows.values() if rule == "audio_tokens"}
        """The parts cut per sample by its audio tokens at the encoder -> LLM boundary (others: image rows)."""
        self.shapes = MessageShapes(layout, renderer, {name: rule for name, (_, rule) in rows.items()})
        """What this rank knows of the forward messages it receives: their shapes from the plan."""
        self._sized: frozenset[int] = frozenset()
        self.cross_replica = cross_replica
        """The run has channels between replicas (encoder work moved across them: the boundary
        message's pieces, ``entrain.core.ir.p2p.encoder_pieces``)."""
        self._handlers: dict[ActionKind, Callable[[Action], None]] = {
            ActionKind.F: self._forward,
            ActionKind.B: self._backward,
            ActionKind.I: self._backward_input,
            ActionKind.W: self._backward_weight,
            ActionKind.SEND_F: self._send_forward,
            ActionKind.RECV_F: self._recv_forward,
            ActionKind.SEND_B: self._send_backward,
            ActionKind.RECV_B: self._recv_backward,
        }

    # --- public -------------------------------------------------------------------------------------
    def run(
        self, it: IterationPlan, actions: tuple[Action, ...], *, loss_scale: float, forward_only: bool = False
    ) -> StepOutput:
        """Execute this rank's actions of iteration ``it`` in the order of its point-to-point program
        (``entrain.core.ir.p2p.rank_program``, the order the NCCL replay checks); gradients accumulate
        into the stage parameters. ``actions`` must be the Plan's list for this rank."""
        if tuple(actions) != tuple(it.actions.get(self.rank, ())):
            raise RuntimeError(f"rank {self.rank}: the actions given are not the Plan's list for this rank")
        self._reset(it, loss_scale, forward_only)
        self._sized = self.shapes.known_stages()  # fixed for the step: the program and receives agree
        program = rank_program(
            self.layout,
            it,
            self.rank,
            forward_only=forward_only,
            warmup=not self.transport.warmed,
            known_shape=lambda m: m.src in self._sized,
            cross_replica=self.cross_replica,
        )
        self._preposting = self.transport.prepost_gradients and not forward_only
        if self._preposting:
            self._unposted = receive_queues(program)
        grad_mode = torch.no_grad() if forward_only else nullcontext()
        if self.tracer is not None:
            self.tracer.start_step(self.device)
        with grad_mode:
            for step in program:
                self._run_step(step)
        self._collect_events()
        if self.tracer is not None:
            self.tracer.finish_step()
        out = StepOutput(self._loss_sum, self._records)
        self._reset(it, loss_scale, forward_only)
        return out

    def _run_step(self, step: Step) -> None:
        if isinstance(step, WarmUp):
            try:
                self.transport.warm_up(step.batches)
            except Exception as e:
                raise WarmUpError(self.process_rank(self.rank), e) from e
            return
        a = step if isinstance(step, Action) else step.action
        if a.stage not in self.modules:
            raise RuntimeError(f"rank {self.rank}: action {a} for stage {a.stage}, which it does not hold")
        run = (lambda: self._comm(step)) if isinstance(step, Comm) else (lambda: self._handlers[a.kind](a))
        try:
            if self.tracer is None:
                run()
            else:
                token = self.tracer.begin()
                run()
                self.tracer.end(a, token, self._peer_of(a))
        except Exception as e:
            peer = self._peer_of(a)
            peer = None if peer is None else self.process_rank(peer)
            raise ExecutionError(self.process_rank(self.rank), a, peer, e) from e

    # --- state --------------------------------------------------------------------------------------
    def _reset(self, it: IterationPlan, loss_scale: float, forward_only: bool) -> None:
        self._it, self._loss_scale, self._forward_only = it, loss_scale, forward_only
        self._pieces: Pieces = encoder_pieces(self.layout, it)
        self._inputs: dict[Key, Parts] = {}
        self._messages: dict[tuple[int, int], Parts] = {}
        self._arrived: dict[tuple[int, int], Parts] = {}
        """Several encoder pipelines: the parts of (mb, sub) the first LLM stage has so far, renamed."""
        self._arrived_from: dict[tuple[int, int], int] = {}
        self._features: dict[str, tuple[tuple[int, int], Parts]] = {}
        self._used: dict[Key, list[torch.Tensor]] = {}
        self._outputs: dict[Key, Parts] = {}
        """Per task, the parts its stage sends (``StageSpec.part_names``; the last stage: its loss)."""
        self._riders: dict[Key, Parts] = {}
        """Per task, the parts it sends on as it received them (input leaves), by name."""
        self._preposting = False
        self._unposted: dict[int, deque[Message]] = defaultdict(deque)
        """Per peer: the messages still to receive from it, in program (= channel) order, when gradient
        receives are posted ahead (``_prepost``); empty otherwise."""
        self._out_grads: dict[Key, Parts] = {}
        self._pending_w: dict[Key, Callable[[], None]] = {}
        self._loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self._records: list[ComputeRecord] = []
        self._events: list[tuple[Action, str, object, object, float]] = []

    def _ids(self, stage: int, mb: int, sub: int) -> tuple[str, ...]:
        spec = self._it.microbatches[self.replica][mb]
        subs = spec.encoder_subs if stage < self.first_llm else spec.llm_subs
        return subs[sub]

    def _peer(self, stage: int) -> int:
        return self.layout.global_rank(self.replica, self.layout.stages[stage].pp_rank)

    def _peer_of(self, a: Action) -> int | None:
        """The rank a communication action talks to (None for compute)."""
        if a.kind in (ActionKind.SEND_F, ActionKind.RECV_B):
            return self._peer(self._next[a.stage])
        if a.kind in (ActionKind.RECV_F, ActionKind.SEND_B):  # several encoders: the first pipeline's
            return self._peer(self._prev[a.stage][0])
        return None

    def _is_local(self, stage: int) -> bool:
        return 0 <= stage <= self.last_stage and self._peer(stage) == self.rank

    def _leaf(self, t: torch.Tensor, stage: int) -> torch.Tensor:
        t = t.detach()
        return t.requires_grad_(self.input_grad[stage] and not self._forward_only and t.is_floating_point())

    def _accept_input(self, stage: int, mb: int, sub: int, parts: Parts, src: int) -> None:
        """Store stage ``stage``'s input parts (mb, sub) from stage ``src``; on the first LLM stage,
        once every encoder pipeline's message is in, route every part's rows by sample id."""
        leaves = {name: self._leaf(t, stage) for name, t in parts.items()}
        if stage != self.first_llm:
            self._inputs[(stage, mb, sub)] = leaves
            return
        if self._renames:  # one message per encoder pipeline: merged under the LLM's part names
            got = self._arrived.setdefault((mb, sub), {})
            got.update({self._renames[src].get(n, n): t for n, t in leaves.items()})
            self._arrived_from[(mb, sub)] = self._arrived_from.get((mb, sub), 0) + 1
            if self._arrived_from[(mb, sub)] < len(self._prev[stage]):
                return
            leaves = self._arrived.pop((mb, sub))
        self._messages[(mb, sub)] = leaves
        own = set(self._piece_ids(self.replica, self.replica, mb, sub))  # what stayed on this replica
        ids = [sid for sid in self._ids(stage - 1, mb, sub) if sid in own]
        self._route((mb, sub), ids, leaves, f"encoder message {mb}.{sub}")

    def _route(self, key: tuple, ids: Sequence[str], leaves: Parts, what: str) -> None:
        """Cut every part of encoder message ``key`` into the rows of samples ``ids`` (in order)."""
        starts = dict.fromkeys(leaves, 0)
        for sid in ids:
            rows = {n: self._sample_rows(sid, n) for n in leaves}
            self._features[sid] = (key, {n: t[starts[n] : starts[n] + rows[n]] for n, t in leaves.items()})
            starts = {n: starts[n] + rows[n] for n in leaves}
        for name, t in leaves.items():
            assert starts[name] == t.shape[0], (
                f"{what} part {name}: {t.shape[0]} rows, plan says {starts[name]}"
            )

    def _accept_piece(self, mb: int, sub: int, replica: int, parts: Parts) -> None:
        """Store the piece of ``replica``'s encoder message (mb, sub) this replica owns, its rows routed
        by sample id as the first LLM stage's own messages are."""
        leaves = {name: self._leaf(t, self.first_llm) for name, t in parts.items()}
        key = (mb, sub, replica)
        self._messages[key] = leaves
        ids = self._piece_ids(replica, self.replica, mb, sub)
        self._route(key, ids, leaves, f"piece {mb}.{sub} of replica {replica}")

    def _input_leaf(self, stage: int, mb: int, sub: int) -> Parts:
        return self._messages[(mb, sub)] if stage == self.first_llm else self._inputs[(stage, mb, sub)]

    def _leaves_from(self, src: int, stage: int, mb: int, sub: int) -> Parts:
        """Stage ``stage``'s input leaves (mb, sub) that came from stage ``src``, by ``src``'s part names."""
        leaves, names = self._input_leaf(stage, mb, sub), self._renames.get(src, {})
        return {n: leaves[names.get(n, n)] for n in self.layout.stages[src].part_names}

    def _timed(self, a: Action, kind: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` and record its time: on the CPU wall and thread-CPU ms at once; on a GPU a pair
        of CUDA events, read once per step (``_collect_events``), so no action waits for the device."""
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            c0 = time.thread_time()
            start.record()
            fn()
            end.record()
            self._events.append((a, kind, start, end, (time.thread_time() - c0) * 1e3))
            return
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        wall_ms, cpu_ms = (time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3
        self._records.append(ComputeRecord(a.stage, kind, a.mb, a.sub_index, wall_ms, cpu_ms))

    def _collect_events(self) -> None:
        if not self._events:
            return
        self._events[-1][3].synchronize()
        for a, kind, start, end, cpu_ms in self._events:
            self._records.append(
                ComputeRecord(a.stage, kind, a.mb, a.sub_index, start.elapsed_time(end), cpu_ms)
            )
        self._events.clear()

    # --- compute ------------------------------------------------------------------------------------
    def _forward(self, a: Action) -> None:
        s, mb, sub = a.stage, a.mb, a.sub_index
        ids = self._ids(s, mb, sub)
        module = self.modules[s]
        # data (rendered tensors) is prepared outside the timed compute, as a data loader would
        if self._is_encoder[s]:
            inputs = self._encoder_inputs(s, ids)
        else:
            inputs = self.renderer.llm_batch(ids, self._loss_scale)
        self._timed(a, "F", lambda: self._forward_compute(a, ids, module, inputs))

    def _forward_compute(self, a: Action, ids, module, inputs) -> None:
        s, mb, sub = a.stage, a.mb, a.sub_index
        with self.autocast():
            if self._is_encoder[s]:
                out, given = self._encoder_forward(module, s, mb, sub, inputs)
            else:
                out, given = self._llm_forward(module, s, mb, sub, ids, inputs)
        parts = self._outputs[(s, mb, sub)] = self._output_parts(s, out, given)
        self._riders[(s, mb, sub)] = {n: t for n, t in parts.items() if given.get(n) is t and t.is_leaf}
        if s == self.last_stage:
            self._loss_sum = self._loss_sum + parts[HIDDEN].detach().double()  # stays on the device: no sync
        elif self._is_local(self._next[s]):
            self._accept_input(self._next[s], mb, sub, parts, s)

    def _output_parts(self, s: int, out: torch.Tensor | Parts, given: Parts) -> Parts:
        """The parts stage ``s`` sends: what its module returned (a tensor is the ``HIDDEN`` part) and,
        riding along, the declared parts it did not return but received (``given``)."""
        parts = dict(out) if isinstance(out, dict) else {HIDDEN: out}
        names = (HIDDEN,) if s == self.last_stage else self.layout.stages[s].part_names
        unknown = sorted(set(parts) - set(names))
        missing = [n for n in names if n not in parts and n not in given]
        if unknown or missing:
            raise RuntimeError(
                f"stage {s} returned parts {sorted(parts)}: its message carries {list(names)} (the family's "
                f"LayerSpec.message_parts); undeclared {unknown}, neither returned nor received {missing}"
            )
        return {n: parts[n] if n in parts else given[n] for n in names}

    def _call(self, module: nn.Module, x: Parts | None, other) -> torch.Tensor | Parts:
        """``module`` on its input parts: all of them with ``takes_parts``, else the ``HIDDEN`` one."""
        if getattr(module, "takes_parts", False):
            return module({} if x is None else x, other)
        return module(None if x is None else x.get(HIDDEN), other)

    def _encoder_inputs(self, s: int, ids: Sequence[str]):
        """What encoder stage ``s``'s forward reads besides its input message: a pipeline's first stage
        its rendered input (an audio pipeline's: the clips' mel frames), every stage the samples' image
        grids (an audio pipeline's: the clips' frame counts)."""
        first = not self._prev[s]
        if s in self._audio_stages:
            mel = self.renderer.encoder_input(ids, "audio").audio.get(AUDIO_MEL) if first else None
            return mel, self.renderer.audio_lengths(ids)
        return self.renderer.encoder_input(ids, self.input_kind(s)) if first else self.renderer.grid_thw(ids)

    def input_kind(self, stage: int) -> str:
        """What encoder stage ``stage``'s pipeline reads (``data.ENCODER_INPUTS``): images and audio
        clips with one encoder component, else its tower's."""
        if not self._renames:
            return "encoder"
        return "audio" if stage in self._audio_stages else "images"

    def _audio_forward(self, module: nn.Module, s: int, mb: int, sub: int, inputs) -> tuple:
        """An audio pipeline's stage on its clips: the first on their mel frames (an empty message
        without any), a later one on the message it received."""
        mel, lengths = inputs
        if self._prev[s]:
            given = self._inputs[(s, mb, sub)]
            self._used[(s, mb, sub)] = list(given.values())
            return module(given, lengths), given
        if mel is None:
            mel = torch.zeros((0, 0), dtype=self.renderer.dtype, device=self.device)
        return module({AUDIO_MEL: mel}, lengths), {}

    def _encoder_forward(self, module: nn.Module, s: int, mb: int, sub: int, inputs) -> tuple:
        if s in self._audio_stages:
            return self._audio_forward(module, s, mb, sub, inputs)
        first = not self._prev[s]
        if first:
            x, given, grid, audio = inputs.patches, {}, inputs.grid_thw, inputs.audio
        else:
            given = self._inputs[(s, mb, sub)]
            self._used[(s, mb, sub)] = list(given.values())
            x, grid, audio = given[HIDDEN], inputs, {}
        if grid.shape[0] == 0 and not audio:  # no image: nothing to encode
            dim = self._out_dim(module)  # received audio features ride on
            empty = {
                p.name: given.get(p.name, x.new_zeros((0, p.width))) for p in self.layout.stages[s].parts
            }
            return {HIDDEN: x.new_zeros((0, dim)), **empty}, given
        if audio:  # audio clips: the first stage's module takes every input part
            return module({HIDDEN: x, **audio}, grid), given
        return (module(x, grid) if first else self._call(module, given, grid)), given

    @staticmethod
    def _out_dim(module: nn.Module) -> int:
        """Columns of an encoder stage's output (``ModelFamily.encoder_output_width``)."""
        return family_of(module).encoder_output_width(module)

    def _llm_forward(self, module: nn.Module, s: int, mb: int, sub: int, ids, batch) -> tuple:
        if s == self.first_llm:
            with_images = [sid for sid in ids if self.renderer.sample(sid).encoded_rows]
            missing = [sid for sid in with_images if sid not in self._features]
            if missing:
                raise RuntimeError(
                    f"rank {self.rank}: {s}F{mb}.{sub} has no encoder output for samples {missing}"
                )
            found = [self._features.pop(sid) for sid in with_images]
            names = found[0][1] if found else {}
            x = {n: torch.cat([rows[n] for _, rows in found]) for n in names} if found else None
            messages = dict.fromkeys(k for k, _ in found)
            self._used[(s, mb, sub)] = [t for k in messages for t in self._messages[k].values()]
        else:
            x = self._inputs[(s, mb, sub)]
            self._used[(s, mb, sub)] = list(x.values())
        return self._call(module, x, batch), x or {}

    def _output_grad(self, s: int, mb: int, sub: int) -> Parts | None:
        if s == self.last_stage:
            return None
        key = (s, mb, sub)
        if key in self._out_grads:
            return self._out_grads.pop(key)
        assert self._is_local(self._next[s]), f"rank {self.rank}: no gradient received for {s}B{mb}.{sub}"
        leaves = self._leaves_from(s, self._next[s], mb, sub)
        out = self._outputs[key]
        return {n: torch.zeros_like(t) if leaves[n].grad is None else leaves[n].grad for n, t in out.items()}

    def _backward_parts(self, key: Key) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """The output parts of ``key`` to back-propagate and their gradients (None: the loss). A part
        riding along hands its gradient straight to its input leaf."""
        grads = self._output_grad(*key)
        out, riders = self._outputs.pop(key), self._riders.pop(key, {})
        outs, out_grads = [], []
        for name, t in out.items():
            if name in riders:
                if t.requires_grad:
                    t.grad = grads[name].clone() if t.grad is None else t.grad + grads[name]
            elif t.requires_grad:
                outs.append(t)
                out_grads.append(None if grads is None else grads[name])
        return outs, None if grads is None else out_grads

    def _backward(self, a: Action) -> None:
        def run() -> None:
            key = (a.stage, a.mb, a.sub_index)
            outs, grads = self._backward_parts(key)
            self._used.pop(key, None)
            if outs:
                torch.autograd.backward(outs, grads)

        self._timed(a, "B", run)

    def _backward_input(self, a: Action) -> None:
        def run() -> None:
            key = (a.stage, a.mb, a.sub_index)
            outs, grads = self._backward_parts(key)
            leaves = [t for t in self._used.pop(key, []) if t.requires_grad]
            params = [p for _, p in self.modules[a.stage].owned_parameters() if p.requires_grad]
            self._pending_w[key] = _no_weight_grads
            if not outs:
                return
            if not leaves:  # nothing upstream waits: the whole backward runs at W
                self._pending_w[key] = lambda: torch.autograd.backward(outs, grads, inputs=params)
            elif not params:
                torch.autograd.backward(outs, grads, inputs=leaves)
            else:
                _, groups = stage_backward_input(outs, grads, leaves, iter(params))
                self._pending_w[key] = lambda: stage_backward_weight(iter(params), groups)

        self._timed(a, "I", run)

    def _backward_weight(self, a: Action) -> None:
        self._timed(a, "W", self._pending_w.pop((a.stage, a.mb, a.sub_index)))


def _encoder_rows(layout: Layout, renderer: SampleRenderer) -> dict[str, tuple[str, str]]:
    """With several encoder pipelines: per encoder name, the first LLM stage's part its output becomes
    and that part's rows (``ModelFamily.encoder_parts``); empty with one encoder."""
    if not layout.multi_encoder:
        return {}
    declared = getattr(renderer.family, "encoder_parts", {})
    missing = [n for n in layout.encoder_names if n not in declared]
    if missing:
        raise ConfigError(
            f"this plan has encoders {list(layout.encoder_names)} in separate pipelines; model family "
            f"{renderer.family.name!r} declares encoder pipelines {sorted(declared)} (its encoder_parts), not {missing}"
        )
    return {n: declared[n] for n in layout.encoder_names}
