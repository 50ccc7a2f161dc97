"""Plan validator: a broken Plan raises ``ScheduleError`` with the per-rank action grid.

Checks, per iteration and replica (``validate_plan``):

1. every action names a stage held by its rank, an existing microbatch position and sub;
2. every (stage, mb, sub) runs ``F`` exactly once and either ``B`` once or ``I`` and ``W`` once
   each, ``F`` before ``B``/``I`` before ``W``;
3. every message between stages on different ranks (``entrain.core.ir.graph``) has exactly
   one ``SEND`` on the sender and one ``RECV`` on the receiver, and no other communication exists;
4. the lists cannot deadlock: a lockstep replay (every rank tries its next action each step; a
   ``RECV`` waits for its ``SEND``, a compute action for its inputs) finishes.

The error message names the global rank and step and prints one row per rank (a window of steps
around the error) with the offending action marked ``<-- ERROR HERE``.
"""

from __future__ import annotations

from collections import Counter

from entrain.core.errors import ScheduleError
from entrain.core.ir.graph import Message, ReplicaGraph
from entrain.core.ir.plan import Action, ActionKind, IterationPlan, Layout, Plan

__all__ = [
    "validate_plan",
    "validate_iteration",
    "validate_replica",
    "format_grid",
    "message_of",
    "messages_of",
]

_F, _B, _I, _W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W


def validate_plan(plan: Plan) -> None:
    for i, it in enumerate(plan.iterations):
        validate_iteration(plan.layout, it, iteration=i)


def validate_iteration(layout: Layout, it: IterationPlan, iteration: int = 0) -> None:
    expected_ranks = set(range(layout.world_size))
    if set(it.actions) != expected_ranks:
        missing = sorted(expected_ranks - set(it.actions))
        extra = sorted(set(it.actions) - expected_ranks)
        raise ScheduleError(
            f"iteration {iteration}: action lists for ranks missing {missing}, unexpected {extra}"
        )
    if len(it.microbatches) != layout.dp:
        raise ScheduleError(
            f"iteration {iteration}: {len(it.microbatches)} replicas of microbatches, dp={layout.dp}"
        )
    for replica in range(layout.dp):
        ranks = [layout.global_rank(replica, r) for r in range(layout.ranks_per_replica)]
        validate_replica(layout, it.microbatches[replica], {g: list(it.actions[g]) for g in ranks}, iteration)


def validate_replica(
    layout: Layout, microbatches, actions: dict[int, list[Action]], iteration: int = 0
) -> None:
    """``actions``: global rank -> its list, for the ranks of one replica (in pp_rank order)."""
    graph = ReplicaGraph(layout, tuple(microbatches))
    for pos, spec in enumerate(microbatches):
        if spec.mb != pos:
            raise ScheduleError(f"iteration {iteration}: microbatch at position {pos} says mb={spec.mb}")
    v = _Validator(layout, graph, actions, iteration)
    v.check_placement()
    v.check_compute()
    v.check_comms()
    v.check_progress()


class _Validator:
    def __init__(self, layout: Layout, graph: ReplicaGraph, actions: dict[int, list[Action]], iteration: int):
        self.layout, self.graph, self.actions, self.iteration = layout, graph, actions, iteration
        self.pp_of = {g: layout.replica_of(g)[1] for g in actions}

    def fail(self, rank: int, step: int, reason: str) -> None:
        head = f"iteration {self.iteration}: rank {rank} step {step}: {reason}"
        raise ScheduleError(head + "\n" + format_grid(self.actions, {rank: step}))

    # 1. placement and ranges
    def check_placement(self) -> None:
        n_stages, n_mb = len(self.layout.stages), len(self.graph.microbatches)
        for g, acts in self.actions.items():
            for i, a in enumerate(acts):
                if not 0 <= a.stage < n_stages:
                    self.fail(g, i, f"{a}: no stage {a.stage} (plan has {n_stages})")
                if self.layout.stages[a.stage].pp_rank != self.pp_of[g]:
                    owner = self.layout.stages[a.stage].pp_rank
                    self.fail(g, i, f"{a}: stage {a.stage} is held by pp rank {owner}, not {self.pp_of[g]}")
                if not 0 <= a.mb < n_mb:
                    self.fail(g, i, f"{a}: no microbatch {a.mb} (replica has {n_mb})")
                if a.kind.is_compute and a.sub_index >= self.graph.num_subs(a.stage, a.mb):
                    self.fail(
                        g,
                        i,
                        f"{a}: microbatch {a.mb} has {self.graph.num_subs(a.stage, a.mb)} subs on stage {a.stage}",
                    )

    # 2. each task's compute exactly once, in order
    def check_compute(self) -> None:
        where: dict[tuple[ActionKind, int, int, int], tuple[int, int]] = {}
        for g, acts in self.actions.items():
            for i, a in enumerate(acts):
                if not a.kind.is_compute:
                    continue
                key = (a.kind, a.stage, a.mb, a.sub_index)
                if key in where:
                    self.fail(g, i, f"{a} runs twice (first at step {where[key][1]})")
                where[key] = (g, i)
        for stage in range(len(self.layout.stages)):
            for _, m, u in self.graph.tasks(stage):
                self._check_task(where, stage, m, u)

    def _check_task(self, where, stage: int, m: int, u: int) -> None:
        name = f"{stage}?{m}" + (f".{u}" if self.graph.num_subs(stage, m) > 1 else "")
        g = self._global(self.layout.stages[stage].pp_rank)
        f = where.get((_F, stage, m, u))
        if f is None:
            self.fail(g, len(self.actions[g]), f"{name.replace('?', 'F')} is missing")
        b, i, w = (where.get((k, stage, m, u)) for k in (_B, _I, _W))
        if b is None and (i is None or w is None):
            self.fail(g, len(self.actions[g]), f"{name.replace('?', 'B')} (or I and W) is missing")
        if b is not None and (i is not None or w is not None):
            self.fail(*b, f"{name.replace('?', 'B')} runs besides I/W")
        first_bwd = b or i
        if first_bwd[1] < f[1]:
            self.fail(*first_bwd, f"backward of {name.replace('?', '')} before its forward (step {f[1]})")
        if w is not None and w[1] < i[1]:
            self.fail(*w, f"W before I of {name.replace('?', '')}")

    def _global(self, pp_rank: int) -> int:
        return next(g for g, r in self.pp_of.items() if r == pp_rank)

    # 3. sends and receives pair one-to-one
    def check_comms(self) -> None:
        expected = {m for m in self.graph.all_messages() if self.graph.is_remote(m)}
        for want_send in (True, False):
            seen: Counter[Message] = Counter()
            for g, acts in self.actions.items():
                for i, a in enumerate(acts):
                    if a.kind.is_compute:
                        continue
                    is_send = a.kind in (ActionKind.SEND_F, ActionKind.SEND_B)
                    if is_send != want_send:
                        continue
                    msgs = messages_of(self.layout, a)
                    if not msgs:
                        self.fail(g, i, f"{a}: no such message between ranks (stage {a.stage} has no peer)")
                    for msg in msgs:
                        if msg not in expected:
                            self.fail(g, i, f"{a}: no such message between ranks ({_describe(msg)})")
                        seen[msg] += 1
                        if seen[msg] > 1:
                            verb = "sent" if is_send else "received"
                            self.fail(g, i, f"{a}: {_describe(msg)} is {verb} twice")
            for msg in sorted(expected - set(seen)):
                act = self.graph.send_action(msg) if want_send else self.graph.recv_action(msg)
                g = self._global(self.graph.rank_of(msg.src if want_send else msg.dst))
                self.fail(
                    g,
                    len(self.actions[g]),
                    f"{act} is missing: {_describe(msg)} has no {'SEND' if want_send else 'RECV'}",
                )

    # 4. lockstep replay
    def check_progress(self) -> None:
        done: set[tuple[str, int, int, int]] = set()
        sent: set[Message] = set()
        received: set[tuple[int, Message]] = set()
        ptr = dict.fromkeys(self.actions, 0)
        while any(ptr[g] < len(acts) for g, acts in self.actions.items()):
            runnable = [
                g
                for g, acts in self.actions.items()
                if ptr[g] < len(acts) and self._ready(g, acts[ptr[g]], done, sent, received)
            ]
            if not runnable:
                blocked = {g: ptr[g] for g, acts in self.actions.items() if ptr[g] < len(acts)}
                g0 = min(blocked)
                lines = [
                    f"rank {g} step {s} ({self.actions[g][s]}) waits for {self._waits_for(g, self.actions[g][s], done, sent, received)}"
                    for g, s in blocked.items()
                ]
                head = f"iteration {self.iteration}: deadlock: no rank can progress; " + "; ".join(lines)
                raise ScheduleError(head + "\n" + format_grid(self.actions, blocked, primary=g0))
            for g in runnable:
                self._apply(g, self.actions[g][ptr[g]], done, sent, received)
                ptr[g] += 1

    def _ready(self, g, a: Action, done, sent, received) -> bool:
        return not self._missing(g, a, done, sent, received)

    def _missing(self, g, a: Action, done, sent, received) -> list[str]:
        graph, u = self.graph, a.sub_index
        out: list[str] = []
        if a.kind is ActionKind.RECV_F or a.kind is ActionKind.RECV_B:
            return [
                f"its SEND ({self.graph.send_action(m)})"
                for m in messages_of(self.layout, a)
                if m not in sent
            ]
        if a.kind.is_comm:
            return []
        if a.kind is _F:
            for msg in graph.fwd_inputs(a.stage, a.mb, u):
                out += self._msg_missing(g, msg, done, received)
        elif a.kind in (_B, _I):
            if ("F", a.stage, a.mb, u) not in done:
                out.append(f"{Action(a.stage, _F, a.mb, a.sub)}")
            for msg in graph.bwd_inputs(a.stage, a.mb, u):
                out += self._msg_missing(g, msg, done, received)
        elif a.kind is _W and ("I", a.stage, a.mb, u) not in done:
            out.append(f"{Action(a.stage, _I, a.mb, a.sub)}")
        return out

    def _msg_missing(self, g, msg: Message, done, received) -> list[str]:
        if self.graph.is_remote(msg):
            return [] if (g, msg) in received else [f"{self.graph.recv_action(msg)}"]
        if msg.kind == "F":
            s, m, u = self.graph.fwd_producer(msg)
            return [] if ("F", s, m, u) in done else [f"{s}F{m}.{u}"]
        return [f"{s}B{m}.{u}" for s, m, u in self.graph.bwd_producers(msg) if ("B", s, m, u) not in done]

    def _waits_for(self, g, a, done, sent, received) -> str:
        return ", ".join(self._missing(g, a, done, sent, received)) or "nothing"

    def _apply(self, g, a: Action, done, sent, received) -> None:
        if a.kind is _F:
            done.add(("F", a.stage, a.mb, a.sub_index))
        elif a.kind in (_B, _I):
            done.add(("B", a.stage, a.mb, a.sub_index))
            if a.kind is _I:
                done.add(("I", a.stage, a.mb, a.sub_index))
        elif a.kind is _W:
            done.add(("W", a.stage, a.mb, a.sub_index))
        elif a.kind in (ActionKind.SEND_F, ActionKind.SEND_B):
            for msg in messages_of(self.layout, a):
                if msg.kind == "F" and ("F", msg.src, msg.mb, msg.sub) not in done:
                    self.fail(g, self.actions[g].index(a), f"{a} before the forward producing it")
                if msg.kind == "B":
                    pending = [t for t in self.graph.bwd_producers(msg) if ("B", *t) not in done]
                    if pending:
                        self.fail(g, self.actions[g].index(a), f"{a} before the backward of {pending[0]}")
                sent.add(msg)
        else:
            received.update((g, m) for m in messages_of(self.layout, a))


def messages_of(layout: Layout, a: Action) -> tuple[Message, ...]:
    """The messages a communication action sends or receives: one (``message_of``), except at the
    first LLM stage of a plan with several encoders, where ``RECV_F`` / ``SEND_B`` stand for one
    message per encoder (from / to each encoder pipeline's last stage held by another rank, in encoder
    order; one on the same rank hands over without a message)."""
    if not layout.multi_encoder:
        return (message_of(a),)
    u = a.sub_index
    if a.kind is ActionKind.SEND_F or a.kind is ActionKind.RECV_B:
        nxt = layout.next_stage(a.stage)
        if nxt is None:
            return ()
        kind = "F" if a.kind is ActionKind.SEND_F else "B"
        src, dst = (a.stage, nxt) if kind == "F" else (nxt, a.stage)
        return (Message(kind, src, dst, a.mb, u),)
    rank = layout.stages[a.stage].pp_rank  # an encoder's last stage on this rank hands over locally
    prev = [p for p in layout.prev_stages(a.stage) if layout.stages[p].pp_rank != rank]
    if a.kind is ActionKind.RECV_F:
        return tuple(Message("F", p, a.stage, a.mb, u) for p in prev)
    if a.kind is ActionKind.SEND_B:
        return tuple(Message("B", a.stage, p, a.mb, u) for p in prev)
    raise ValueError(f"{a} is not a communication action")


def message_of(a: Action) -> Message:
    """The message of a communication action in a one-encoder plan (stage ``s`` talks to ``s - 1`` and
    ``s + 1``); ``messages_of`` covers every plan."""
    u = a.sub_index
    if a.kind is ActionKind.SEND_F:
        return Message("F", a.stage, a.stage + 1, a.mb, u)
    if a.kind is ActionKind.RECV_F:
        return Message("F", a.stage - 1, a.stage, a.mb, u)
    if a.kind is ActionKind.SEND_B:
        return Message("B", a.stage, a.stage - 1, a.mb, u)
    if a.kind is ActionKind.RECV_B:
        return Message("B", a.stage + 1, a.stage, a.mb, u)
    raise ValueError(f"{a} is not a communication action")


def _describe(msg: Message) -> str:
    what = "activations" if msg.kind == "F" else "gradients"
    return f"{what} of ({msg.mb}, {msg.sub}) from stage {msg.src} to stage {msg.dst}"


def format_grid(
    actions: dict[int, list[Action]],
    marks: dict[int, int],
    primary: int | None = None,
    before: int = 8,
    after: int = 4,
) -> str:
    """One row per rank: a window of steps around the marked step of ``primary`` (default: the
    lowest marked rank); each marked action in brackets, the primary row tagged ``<-- ERROR HERE``."""
    if primary is None:
        primary = min(marks)
    center = marks[primary]
    lo = max(0, center - before)
    hi = max(center + after + 1, lo + 1)
    width = max([len(str(a)) for acts in actions.values() for a in acts[lo:hi]] + [5]) + 3
    header = "step    | " + "".join(f"{s:<{width}}" for s in range(lo, hi))
    rows = [header]
    for g in sorted(actions):
        cells = []
        for s in range(lo, hi):
            text = str(actions[g][s]) if s < len(actions[g]) else ("." if s > len(actions[g]) else "<end>")
            if marks.get(g) == s:
                text = f"[{text}]"
            cells.append(f"{text:<{width}}")
        row = f"rank {g:<3}| " + "".join(cells)
        if g == primary:
            row = row.rstrip() + f"  <-- ERROR HERE (step {center})"
        rows.append(row.rstrip())
    return "\n".join(rows)
