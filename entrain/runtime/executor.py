"""Interpret one rank's action list of an ``IterationPlan`` (DESIGN.md section 3).

The executor knows nothing about the system that made the Plan: it runs the actions in order through
a dispatch table with one small handler per ``ActionKind``. Conventions (``entrain.core.plan``):

* a stage's input for ``(mb, sub)`` is a leaf tensor (``detach().requires_grad_()``) received from the
  previous stage; its ``.grad`` is what ``SEND_B`` returns;
* on the first LLM stage the leaves are *encoder messages* ``(mb, sub)`` of the last encoder stage,
  cut into per-sample rows and routed by sample id to whichever LLM (sub-)microbatch consumes them
  (deferred samples simply wait there); the gradient of a message goes back once the Plan says so;
* neighbouring stages on the same rank hand tensors over locally (with or without comm actions);
* ``I`` computes input gradients only; ``W`` the weight gradients, from the gradients ``I`` saved at
  the nodes where weight paths leave the input paths (``torch.distributed.pipelining``'s
  ``stage_backward_input`` / ``stage_backward_weight``), so ``I + W`` costs one backward. A stage
  without input gradients to send (the first one) runs its whole backward at ``W``.

Loss: the last stage's output is ``sum(token CE) / label tokens of the global batch``; backward of
that scalar makes gradients independent of grouping, deferral and splitting.
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

from entrain.core.errors import EntrainError
from entrain.core.p2p import Comm, Step, WarmUp, rank_program, receive_needs_header
from entrain.core.plan import Action, ActionKind, IterationPlan, Layout
from entrain.core.schedules.graph import Message
from entrain.models.families.registry import family_of
from entrain.runtime.comm import MessageKey, Transport
from entrain.runtime.data import SampleRenderer

__all__ = ["Executor", "ExecutionError", "CollectiveError", "ComputeRecord", "StepOutput"]

Key = tuple[int, int, int]  # (stage, mb, sub)


def _no_weight_grads() -> None:
    """``W`` of a stage whose ``I`` left no weight gradients (frozen, or no graph)."""


def cause_line(cause: BaseException) -> str:
    """``Type: first non-empty line`` of an error, then its own cause's when it wraps one (torch's
    pipelining wraps the real error in a message that starts with a blank line)."""
    lines = [x.strip() for x in str(cause).splitlines() if x.strip()]
    text = f"{type(cause).__name__}: {lines[0] if lines else ''}"
    return text if cause.__cause__ is None else f"{text} <- {cause_line(cause.__cause__)}"


class ExecutionError(EntrainError, RuntimeError):
    """An action failed (a peer died or stalled past the process-group timeout, a schedule mismatch):
    names the rank, the action (stage, microbatch, sub) and the peer rank."""

    def __init__(self, rank: int, action: Action, peer: int | None, cause: BaseException):
        self.rank, self.action, self.peer = rank, action, peer
        with_peer = f" with rank {peer}" if peer is not None else ""
        super().__init__(
            f"rank {rank}: action {action} (stage {action.stage}, microbatch {action.mb}, sub "
            f"{action.sub_index}){with_peer} failed: {cause_line(cause)}"
        )


class WarmUpError(EntrainError, RuntimeError):
    """Connecting a rank's point-to-point channels before its first step failed (a peer died or
    stalled past the process-group timeout before it got there)."""

    def __init__(self, rank: int, cause: BaseException):
        self.rank = rank
        super().__init__(
            f"rank {rank}: connecting its point-to-point channels before its first step failed (a peer rank "
            f"died or stalled past --timeout-s): {cause_line(cause)}"
        )


class CollectiveError(EntrainError, RuntimeError):
    """A collective outside the pipeline actions failed (a peer died or stalled past the timeout):
    names the rank, the step, what the collective was for and, when known, the peers that never
    reached it (``entrain.runtime.health.PeerWatch``)."""

    def __init__(
        self, rank: int, step: int, what: str, cause: BaseException, behind: dict[int, str] | None = None
    ):
        self.rank, self.step, self.what, self.behind = rank, step, what, behind or {}
        who = "a peer rank died or stalled past --timeout-s"
        if self.behind:  # from the PeerWatch board: the ranks that never reached this collective
            who = "; ".join(
                f"rank {r} did not get there, it last reached {w!r}" for r, w in sorted(self.behind.items())
            )
            who += " (died, or stalled past --timeout-s)"
        super().__init__(f"rank {rank}: step {step}: {what} failed: {who}: {cause_line(cause)}")


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


class Executor:
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
    ):
        self.layout, self.rank, self.modules = layout, rank, modules
        self._is_encoder = {st.stage: st.component == "encoder" for st in layout.stages}
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
        (``entrain.core.p2p.rank_program``, the order the NCCL replay checks); gradients accumulate
        into the stage parameters. ``actions`` must be the Plan's list for this rank."""
        if tuple(actions) != tuple(it.actions.get(self.rank, ())):
            raise RuntimeError(f"rank {self.rank}: the actions given are not the Plan's list for this rank")
        self._reset(it, loss_scale, forward_only)
        program = rank_program(
            self.layout, it, self.rank, forward_only=forward_only, warmup=not self.transport.warmed
        )
        self._preposting = self.transport.prepost_gradients and not forward_only
        if self._preposting:
            self._unposted = _receive_queues(program)
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

    def _comm(self, c: Comm) -> None:
        """Receive what ``c``'s batches receive (its own message, and any sent before it on the same
        channel), then run the action (a send posts its message; a receive takes its from the stash)."""
        seen: set[tuple[int, Message]] = set()
        for batch in c.batches:
            for op in batch.ops:
                if not op.send and (op.peer, op.message) not in seen:
                    seen.add((op.peer, op.message))
                    self._receive(op.peer, op.message)
        self._handlers[c.action.kind](c.action)

    def _receive(self, peer: int, msg: Message) -> None:
        key = _key(msg)
        if msg.kind == "F":
            ids, like = self._ids(msg.src, msg.mb, msg.sub), None
        else:  # the gradient has the shape and dtype of the output it belongs to
            ids, like = self._ids(msg.dst, msg.mb, msg.sub), self._outputs[(msg.dst, msg.mb, msg.sub)]
        if receive_needs_header(msg) != (like is None):
            raise RuntimeError(f"rank {self.rank}: {key}: the program and the executor disagree on its size")
        queue = self._unposted[peer]
        if queue and queue[0] == msg:
            queue.popleft()
        elif self._preposting and (peer, key.code) not in self.transport.preposted:
            raise RuntimeError(f"rank {self.rank}: {key} received out of its channel's order")
        self.transport.receive(peer, key, ids, like=like)
        self._prepost(peer)

    def _prepost(self, peer: int) -> None:
        """Post, in the channel's order, the gradient receives from ``peer`` whose forward output exists
        (``Transport.prepost_gradients``; a no-op otherwise)."""
        queue = self._unposted[peer]
        while queue and queue[0].kind == "B" and (queue[0].dst, queue[0].mb, queue[0].sub) in self._outputs:
            msg = queue.popleft()
            self.transport.prepost(peer, _key(msg), self._outputs[(msg.dst, msg.mb, msg.sub)])

    # --- state --------------------------------------------------------------------------------------
    def _reset(self, it: IterationPlan, loss_scale: float, forward_only: bool) -> None:
        self._it, self._loss_scale, self._forward_only = it, loss_scale, forward_only
        self._inputs: dict[Key, torch.Tensor] = {}
        self._messages: dict[tuple[int, int], torch.Tensor] = {}
        self._features: dict[str, tuple[tuple[int, int], torch.Tensor]] = {}
        self._used: dict[Key, list[torch.Tensor]] = {}
        self._outputs: dict[Key, torch.Tensor] = {}
        self._preposting = False
        self._unposted: dict[int, deque[Message]] = defaultdict(deque)
        """Per peer: the messages still to receive from it, in program (= channel) order, when gradient
        receives are posted ahead (``_prepost``); empty otherwise."""
        self._out_grads: dict[Key, torch.Tensor] = {}
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
            return self._peer(a.stage + 1)
        if a.kind in (ActionKind.RECV_F, ActionKind.SEND_B):
            return self._peer(a.stage - 1)
        return None

    def _is_local(self, stage: int) -> bool:
        return 0 <= stage <= self.last_stage and self._peer(stage) == self.rank

    def _leaf(self, t: torch.Tensor, stage: int) -> torch.Tensor:
        t = t.detach()
        return t.requires_grad_(self.input_grad[stage] and not self._forward_only and t.is_floating_point())

    def _accept_input(self, stage: int, mb: int, sub: int, t: torch.Tensor) -> None:
        """Store stage ``stage``'s input (mb, sub); on the first LLM stage, route rows by sample id."""
        leaf = self._leaf(t, stage)
        if stage != self.first_llm:
            self._inputs[(stage, mb, sub)] = leaf
            return
        self._messages[(mb, sub)] = leaf
        start = 0
        for sid in self._ids(stage - 1, mb, sub):
            rows = self.renderer.sample(sid).image_tokens
            self._features[sid] = ((mb, sub), leaf[start : start + rows])
            start += rows
        assert start == leaf.shape[0], f"encoder message {mb}.{sub}: {leaf.shape[0]} rows, plan says {start}"

    def _input_leaf(self, stage: int, mb: int, sub: int) -> torch.Tensor:
        return self._messages[(mb, sub)] if stage == self.first_llm else self._inputs[(stage, mb, sub)]

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
            inputs = self.renderer.encoder_input(ids) if s == 0 else self.renderer.grid_thw(ids)
        else:
            inputs = self.renderer.llm_batch(ids, self._loss_scale)
        self._timed(a, "F", lambda: self._forward_compute(a, ids, module, inputs))

    def _forward_compute(self, a: Action, ids, module, inputs) -> None:
        s, mb, sub = a.stage, a.mb, a.sub_index
        with self.autocast():
            if self._is_encoder[s]:
                out = self._encoder_forward(module, s, mb, sub, inputs)
            else:
                out = self._llm_forward(module, s, mb, sub, ids, inputs)
        self._outputs[(s, mb, sub)] = out
        if s == self.last_stage:
            self._loss_sum = self._loss_sum + out.detach().double()  # stays on the device: no sync
        elif self._is_local(s + 1):
            self._accept_input(s + 1, mb, sub, out)

    def _encoder_forward(self, module: nn.Module, s: int, mb: int, sub: int, inputs) -> torch.Tensor:
        if s == 0:
            x, grid = inputs.patches, inputs.grid_thw
        else:
            x = self._inputs[(s, mb, sub)]
            self._used[(s, mb, sub)] = [x]
            grid = inputs
        if grid.shape[0] == 0:  # text-only samples: nothing to encode
            dim = self._out_dim(module)
            return x.new_zeros((0, dim))
        return module(x, grid)

    @staticmethod
    def _out_dim(module: nn.Module) -> int:
        """Columns of an encoder stage's output (``ModelFamily.encoder_output_width``)."""
        return family_of(module).encoder_output_width(module)

    def _llm_forward(self, module: nn.Module, s: int, mb: int, sub: int, ids, batch) -> torch.Tensor:
        if s == self.first_llm:
            with_images = [sid for sid in ids if self.renderer.sample(sid).image_tokens]
            missing = [sid for sid in with_images if sid not in self._features]
            if missing:
                raise RuntimeError(
                    f"rank {self.rank}: {s}F{mb}.{sub} has no encoder output for samples {missing}"
                )
            parts = [self._features.pop(sid) for sid in with_images]
            x = torch.cat([rows for _, rows in parts]) if parts else None
            self._used[(s, mb, sub)] = [self._messages[k] for k in dict.fromkeys(k for k, _ in parts)]
        else:
            x = self._inputs[(s, mb, sub)]
            self._used[(s, mb, sub)] = [x]
        return module(x, batch)

    def _output_grad(self, s: int, mb: int, sub: int) -> torch.Tensor | None:
        if s == self.last_stage:
            return None
        key = (s, mb, sub)
        if key in self._out_grads:
            return self._out_grads.pop(key)
        assert self._is_local(s + 1), f"rank {self.rank}: no gradient received for {s}B{mb}.{sub}"
        g = self._input_leaf(s + 1, mb, sub).grad
        out = self._outputs[key]
        return torch.zeros_like(out) if g is None else g

    def _backward(self, a: Action) -> None:
        def run() -> None:
            key = (a.stage, a.mb, a.sub_index)
            grad = self._output_grad(*key)
            out = self._outputs.pop(key)
            self._used.pop(key, None)
            if out.requires_grad:
                torch.autograd.backward(out, grad)

        self._timed(a, "B", run)

    def _backward_input(self, a: Action) -> None:
        def run() -> None:
            key = (a.stage, a.mb, a.sub_index)
            grad = self._output_grad(*key)
            out = self._outputs.pop(key)
            leaves = [t for t in self._used.pop(key, []) if t.requires_grad]
            params = [p for _, p in self.modules[a.stage].owned_parameters() if p.requires_grad]
            self._pending_w[key] = _no_weight_grads
            if not out.requires_grad:
                return
            if not leaves:  # nothing upstream waits: the whole backward runs at W
                self._pending_w[key] = lambda: torch.autograd.backward(out, grad, inputs=params)
            elif not params:
                torch.autograd.backward(out, grad, inputs=leaves)
            else:
                grads = None if grad is None else [grad]
                _, groups = stage_backward_input([out], grads, leaves, iter(params))
                self._pending_w[key] = lambda: stage_backward_weight(iter(params), groups)

        self._timed(a, "I", run)

    def _backward_weight(self, a: Action) -> None:
        self._timed(a, "W", self._pending_w.pop((a.stage, a.mb, a.sub_index)))

    # --- communication ------------------------------------------------------------------------------
    def _send_forward(self, a: Action) -> None:
        s, mb, sub = a.stage, a.mb, a.sub_index
        if self._is_local(s + 1):
            return
        out = self._outputs[(s, mb, sub)]
        self.transport.send(
            out.detach(), self._peer(s + 1), MessageKey(s, False, mb, sub), self._ids(s, mb, sub)
        )
        self._prepost(self._peer(s + 1))

    def _recv_forward(self, a: Action) -> None:
        s, mb, sub = a.stage, a.mb, a.sub_index
        if self._is_local(s - 1):
            return
        t = self.transport.take(self._peer(s - 1), MessageKey(s - 1, False, mb, sub))
        self._accept_input(s, mb, sub, t)

    def _send_backward(self, a: Action) -> None:
        s, mb, sub = a.stage, a.mb, a.sub_index
        if self._is_local(s - 1):
            return
        leaf = self._input_leaf(s, mb, sub)
        g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        ids = self._ids(s - 1, mb, sub) if s == self.first_llm else self._ids(s, mb, sub)
        self.transport.send(g, self._peer(s - 1), MessageKey(s, True, mb, sub), ids)

    def _recv_backward(self, a: Action) -> None:
        s, mb, sub = a.stage, a.mb, a.sub_index
        if self._is_local(s + 1):
            return
        key = MessageKey(s + 1, True, mb, sub)
        self._out_grads[(s, mb, sub)] = self.transport.take(self._peer(s + 1), key)


def _key(msg: Message) -> MessageKey:
    return MessageKey(msg.src, msg.kind == "B", msg.mb, msg.sub)


def _receive_queues(program: Sequence[Step]) -> dict[int, deque[Message]]:
    """Per peer, the messages a rank's program receives from it, in order (as ``Executor._comm`` takes
    them): the order of the peer's sends on that channel."""
    queues: dict[int, deque[Message]] = defaultdict(deque)
    seen: set[tuple[int, Message]] = set()
    for step in program:
        if not isinstance(step, Comm):
            continue
        for op in (op for batch in step.batches for op in batch.ops if not op.send):
            if (op.peer, op.message) not in seen:
                seen.add((op.peer, op.message))
                queues[op.peer].append(op.message)
    return queues
