"""Data dependencies of a Plan replica: which compute actions feed which, and the messages between them.

This is the one place that turns the Plan IR's conventions (``entrain.core.ir.plan`` docstring) into
dependencies; the lowering pass, the validator, the greedy interleaver and the simulator all use it.

* A *task* is ``(stage, mb, sub)``: one (sub-)microbatch on one stage.
* ``F(s, task)`` consumes the forward message(s) of stage ``s - 1``. Inside a component the message
  has the same ``(mb, sub)``. At the encoder -> LLM boundary (stage ``E``) samples are routed by id:
  LLM task ``(E, j, k)`` consumes every encoder message ``(E-1, m, u)`` sharing a sample with it, and
  the message keeps the *encoder*'s label ``(m, u)``.
* With several encoders (``Layout.multi_encoder``) "stage ``s - 1``" / "``s + 1``" are the stage's
  neighbours in its pipeline (``Layout.prev_stages`` / ``next_stage``): the first LLM stage consumes
  the messages of every encoder's last stage, one per encoder for each encoder label, and sends each
  its gradient; an encoder pipeline's first stage has no input.
* ``B`` (or ``I``) of a task consumes the gradient message of stage ``s + 1`` with the same label;
  at the boundary, the gradient of encoder message ``(m, u)`` is sent by stage ``E`` once every LLM
  task consuming it has run its backward.
* ``B``/``I`` of a task needs its own ``F``; ``W`` needs its own ``I``.
"""

from __future__ import annotations

from functools import cache, cached_property
from typing import NamedTuple

from entrain.core.ir.plan import Action, ActionKind, Layout, MicrobatchSpec

__all__ = ["Task", "Message", "ReplicaGraph"]

Task = tuple[int, int, int]
"""(stage, mb, sub)."""


class Message(NamedTuple):
    """A p2p message: ``kind`` ``"F"`` (activations, ``src`` the stage before ``dst``) or ``"B"``
    (gradients, ``src`` the stage after ``dst``), labelled ``(mb, sub)`` as the communication actions
    are."""

    kind: str
    src: int
    dst: int
    mb: int
    sub: int

    def send_action(self) -> Action:
        kind = ActionKind.SEND_F if self.kind == "F" else ActionKind.SEND_B
        return Action(self.src, kind, self.mb, self.sub)

    def recv_action(self) -> Action:
        kind = ActionKind.RECV_F if self.kind == "F" else ActionKind.RECV_B
        return Action(self.dst, kind, self.mb, self.sub)


@cache
def _chain(n: int) -> tuple[tuple[int | None, ...], tuple[tuple[int, ...], ...]]:
    """Next stage and previous stages of each of ``n`` stages in one chain."""
    return tuple(s + 1 if s + 1 < n else None for s in range(n)), tuple(
        (s - 1,) if s > 0 else () for s in range(n)
    )


class ReplicaGraph:
    """Dependencies of one replica's microbatches under a layout (pure function of both)."""

    def __init__(self, layout: Layout, microbatches: tuple[MicrobatchSpec, ...]):
        self.layout = layout
        self.microbatches = microbatches
        self.num_stages = len(layout.stages)
        self.num_encoder_stages = layout.num_encoder_stages
        self.stage_ranks = tuple(st.pp_rank for st in layout.stages)
        """Each stage's pipeline rank within the replica (``rank_of``, by index)."""
        n = self.num_stages
        if layout.multi_encoder:
            self._next = tuple(layout.next_stage(s) for s in range(n))
            self._prev = tuple(layout.prev_stages(s) for s in range(n))
        else:  # one chain: what Layout.next_stage / prev_stages say, without asking per stage
            self._next, self._prev = _chain(n)
        self._enc_of: dict[str, tuple[int, int]] = {}
        self._llm_of: dict[str, tuple[int, int]] = {}
        for spec in microbatches:
            for sub, ids in enumerate(spec.encoder_subs):
                for sid in ids:
                    self._enc_of[sid] = (spec.mb, sub)
            for sub, ids in enumerate(spec.llm_subs):
                for sid in ids:
                    self._llm_of[sid] = (spec.mb, sub)

    # --- tasks --------------------------------------------------------------------------------------
    def is_encoder(self, stage: int) -> bool:
        return stage < self.num_encoder_stages

    def ids(self, stage: int, mb: int, sub: int) -> tuple[str, ...]:
        spec = self.microbatches[mb]
        subs = spec.encoder_subs if self.is_encoder(stage) else spec.llm_subs
        return subs[sub]

    def num_subs(self, stage: int, mb: int) -> int:
        spec = self.microbatches[mb]
        return len(spec.encoder_subs if self.is_encoder(stage) else spec.llm_subs)

    def tasks(self, stage: int) -> list[Task]:
        """Every (stage, mb, sub) of a stage, in (mb, sub) order."""
        return [(stage, m, u) for m in range(len(self.microbatches)) for u in range(self.num_subs(stage, m))]

    def rank_of(self, stage: int) -> int:
        """The pipeline rank (within the replica) holding ``stage``."""
        return self.stage_ranks[stage]

    # --- routing at the encoder -> LLM boundary -------------------------------------------------------
    def _boundary(self, stage: int) -> bool:
        return stage == self.num_encoder_stages and 0 < stage

    @cached_property
    def _llm_inputs(self) -> dict[tuple[int, int], list[tuple[int, int]]]:
        """LLM (mb, sub) -> encoder (mb, sub) labels it consumes, sorted."""
        out: dict[tuple[int, int], set[tuple[int, int]]] = {}
        for sid, llm in self._llm_of.items():
            enc = self._enc_of.get(sid)
            if enc is not None:
                out.setdefault(llm, set()).add(enc)
        return {k: sorted(v) for k, v in out.items()}

    @cached_property
    def _enc_consumers(self) -> dict[tuple[int, int], list[tuple[int, int]]]:
        """Encoder (mb, sub) -> LLM (mb, sub) tasks consuming it, sorted."""
        out: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for llm, encs in self._llm_inputs.items():
            for enc in encs:
                out.setdefault(enc, []).append(llm)
        return {k: sorted(v) for k, v in out.items()}

    def grad_slot(self, mb: int, sub: int) -> int:
        """LLM microbatch position whose backward supplies the gradients of encoder (mb, sub):
        the last one consuming any of its samples (``mb`` when nothing consumes it)."""
        consumers = self._enc_consumers.get((mb, sub))
        return max(m for m, _ in consumers) if consumers else mb

    # --- dependencies ---------------------------------------------------------------------------------
    def fwd_inputs(self, stage: int, mb: int, sub: int) -> list[Message]:
        """Forward messages consumed by ``F(stage, mb, sub)``."""
        return [Message("F", p, stage, m, u) for p, m, u in self.fwd_sources(stage, mb, sub)]

    def fwd_sources(self, stage: int, mb: int, sub: int) -> list[Task]:
        """The forward tasks whose outputs ``F(stage, mb, sub)`` consumes: ``fwd_inputs``' sources, in
        its order, without building the messages."""
        prev = self._prev[stage]
        if self._boundary(stage):
            return [(p, m, u) for m, u in self._llm_inputs.get((mb, sub), []) for p in prev]
        return [(p, mb, sub) for p in prev]

    def bwd_sources(self, stage: int, mb: int, sub: int) -> list[Task]:
        """The backward tasks (all on the next stage) whose gradients ``B``/``I`` of (stage, mb, sub)
        consumes: ``bwd_producers`` of its ``bwd_inputs`` message, without building the message."""
        nxt = self._next[stage]
        return [] if nxt is None else self._grad_producers(nxt, mb, sub)

    def fwd_outputs(self, stage: int, mb: int, sub: int) -> list[Message]:
        """Forward messages produced by ``F(stage, mb, sub)``."""
        nxt = self._next[stage]
        if nxt is None:
            return []
        if self._boundary(nxt) and (mb, sub) not in self._enc_consumers:
            return []
        return [Message("F", stage, nxt, mb, sub)]

    def bwd_inputs(self, stage: int, mb: int, sub: int) -> list[Message]:
        """Gradient messages consumed by ``B``/``I`` of (stage, mb, sub)."""
        nxt = self._next[stage]
        if nxt is None:
            return []
        if self._boundary(nxt) and (mb, sub) not in self._enc_consumers:
            return []
        return [Message("B", nxt, stage, mb, sub)]

    def bwd_producers(self, msg: Message) -> list[Task]:
        """Tasks at ``msg.src`` whose backward must all finish before gradient ``msg`` is sent."""
        return self._grad_producers(msg.src, msg.mb, msg.sub)

    def _grad_producers(self, src: int, mb: int, sub: int) -> list[Task]:
        """The backward tasks at ``src`` that make the gradient of (``mb``, ``sub``) it sends back: at the
        boundary, every LLM task consuming the encoder label (none: nothing is sent)."""
        if self._boundary(src):
            return [(src, m, u) for m, u in self._enc_consumers.get((mb, sub), [])]
        return [(src, mb, sub)]

    def bwd_outputs(self, stage: int, mb: int, sub: int) -> list[Message]:
        """Gradient messages that the backward of (stage, mb, sub) contributes to."""
        prev = self._prev[stage]
        if self._boundary(stage):
            labels = self._llm_inputs.get((mb, sub), [])
            return [Message("B", stage, p, m, u) for m, u in labels for p in prev]
        return [Message("B", stage, p, mb, sub) for p in prev]

    def fwd_producer(self, msg: Message) -> Task:
        return (msg.src, msg.mb, msg.sub)

    def all_messages(self) -> list[Message]:
        out: list[Message] = []
        for stage in range(self.num_stages):
            for _, m, u in self.tasks(stage):
                out += self.fwd_outputs(stage, m, u)
                out += self.bwd_outputs(stage, m, u)
        return sorted(set(out))

    def send_action(self, msg: Message) -> Action:
        """``msg``'s SEND action; the sub is omitted (``None``) for a one-sub microbatch."""
        a = msg.send_action()
        return a if self._label_has_subs(msg) else Action(a.stage, a.kind, a.mb, None)

    def recv_action(self, msg: Message) -> Action:
        a = msg.recv_action()
        return a if self._label_has_subs(msg) else Action(a.stage, a.kind, a.mb, None)

    def _label_has_subs(self, msg: Message) -> bool:
        owner = msg.src if msg.kind == "F" else msg.dst
        return self.num_subs(owner, msg.mb) > 1

    def is_remote(self, msg: Message) -> bool:
        return self.rank_of(msg.src) != self.rank_of(msg.dst)
