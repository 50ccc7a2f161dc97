"""A replay of every rank's point-to-point program (``entrain.core.ir.p2p``) under NCCL's semantics.

NCCL does not buffer: a send completes only once the peer has posted the matching receive, the
operations of one communicator run in issue order on its stream, and two ranks match their messages
first-in first-out (``entrain.core.ir.p2p``'s docstring: why the runtime talks over one group per
channel).

``check_program`` replays the programs of a replica: the host posts its batches in order and waits
for each batch with a receive (a host that runs ahead only posts earlier, which cannot deadlock what
this replay finishes); a group's stream starts its batches one at a time, in order; a batch ends
when each of its operations' matches has started; at the end every stream drains. It raises ``ScheduleError`` with the
``<-- ERROR HERE`` grid (``entrain.core.ir.validate.format_grid``) at the first deadlock, or where FIFO
matching would pair two different operations. Posting only ever adds, so one replay that finishes
means every timing finishes. ``single_group`` gives the programs as one communicator would run them
(the order the runtime used before): the checker finds 1F1B's crossed sends there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from entrain.core.errors import ScheduleError
from entrain.core.ir.graph import Message
from entrain.core.ir.p2p import (
    Batch,
    Comm,
    P2POp,
    Pieces,
    Step,
    WarmUp,
    encoder_pieces,
    rank_actions,
    rank_program,
    receiver_orders,
    replica_programs,
)
from entrain.core.ir.plan import Action, ActionKind, IterationPlan, Layout, Plan
from entrain.core.ir.validate import format_grid

__all__ = [
    "NcclRules",
    "CONNECTED",
    "REAL_NCCL",
    "SHARED_QUEUE_ENV",
    "rules_from_env",
    "check_program",
    "check_iteration",
    "check_plan",
    "check_pieces",
]


@dataclass(frozen=True, slots=True)
class NcclRules:
    """What the replay assumes beyond NCCL's rendezvous, in-order streams and FIFO matching.

    ``lazy_connect``: NCCL connects a pair of ranks of a communicator on their first operation on it,
    and the host call that posts that first operation blocks until the peer has posted its own first
    operation on the pair (the connection handshake needs both). ``False``: every pair connected
    before the program starts.

    ``shared_queue``: ``CUDA_DEVICE_MAX_CONNECTIONS=1``: every stream of a GPU feeds one hardware
    queue, so the operations of all of a rank's communicators run in the one order its host posted
    them (a send waiting for its receive holds back every later operation of the rank). ``False``: one
    queue per communicator."""

    lazy_connect: bool = False
    shared_queue: bool = False


CONNECTED = NcclRules()
"""Pairs connected in advance, one queue per communicator (the rules ``check_program`` assumes)."""
REAL_NCCL = NcclRules(lazy_connect=True)
"""NCCL as the runtime meets it: lazy connection setup, one queue per communicator."""
SHARED_QUEUE_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
"""Set to 1, every communicator of a GPU shares one hardware queue (``NcclRules.shared_queue``)."""


def rules_from_env(env: Mapping[str, str], lazy_connect: bool = True) -> NcclRules:
    """The rules a run under environment ``env`` meets (``shared_queue`` where ``SHARED_QUEUE_ENV``
    is 1)."""
    return NcclRules(lazy_connect, env.get(SHARED_QUEUE_ENV, "").strip() == "1")


@dataclass
class _Rank:
    """A rank in the replay: its batches in host order, the host's position, and per stream the
    queue of posted batches (the head batch has started)."""

    batches: list[tuple[int, Batch]]
    """(step, batch) in the order the host posts them; step -1: the warm-up."""
    next: int = 0
    waiting: int | None = None
    """Index of the batch the host waits for (one with a receive)."""
    connecting: tuple[int, tuple[tuple[tuple[int, int], int], ...]] | None = None
    """(batch index, (group, peer) pairs) whose connection the host's post is blocked in."""
    streams: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    """Per communicator, its unfinished batches in order (the head has started or waits in ``queue``)."""
    queue: list[int] = field(default_factory=list)
    """Posted batches not started yet, in post order (the GPU's one queue under ``shared_queue``)."""

    @property
    def host_done(self) -> bool:
        return self.next >= len(self.batches) and self.waiting is None and self.connecting is None

    @property
    def done(self) -> bool:
        return self.host_done and not any(self.streams.values())


def _what(op: P2POp) -> tuple[Message, str, str]:
    """What an operation carries: a send and a receive match only when they carry the same."""
    return (op.message, op.part, op.tensor)


def _comm_steps(steps: Sequence[Step]) -> list[tuple[int, Batch]]:
    return [
        (s.step if isinstance(s, Comm) else -1, b)
        for s in steps
        if not isinstance(s, Action)
        for b in s.batches
    ]


class _Replay:
    def __init__(self, programs: dict[int, Sequence[Step]], iteration: int, rules: NcclRules):
        self.iteration, self.rules = iteration, rules
        self.actions = {
            g: [s if isinstance(s, Action) else s.action for s in steps if not isinstance(s, WarmUp)]
            for g, steps in programs.items()
        }
        self.ranks = {g: _Rank(_comm_steps(steps)) for g, steps in programs.items()}
        self.started: dict[tuple[tuple[int, int], int, int, bool], list[P2POp]] = {}
        """(group, src, dst, is send) -> the operations started on that channel, in order."""
        self.slot: dict[tuple[int, int], tuple[int, ...]] = {}
        """(rank, batch index) -> channel position of each of its operations, once started."""
        self.posted: set[tuple[tuple[int, int], int, int]] = set()
        """(group, rank, peer): ``rank`` has posted an operation with ``peer`` on ``group``."""

    def run(self) -> None:
        while not all(r.done for r in self.ranks.values()):
            if not any([self._progress(g, r) for g, r in self.ranks.items()]):
                self._deadlock()

    def _progress(self, g: int, r: _Rank) -> bool:
        moved = False
        while True:
            step = self._finish_heads(g, r) or self._connect(g, r) or self._host(g, r)
            if not step:
                return moved
            moved = True

    def _unconnected(self, g: int, pairs) -> tuple[tuple[tuple[int, int], int], ...]:
        """The (group, peer) pairs of ``pairs`` whose peer has not posted on them with ``g``."""
        return tuple(p for p in pairs if (p[0], p[1], g) not in self.posted)

    def _connect(self, g: int, r: _Rank) -> bool:
        """Return the host from its connection handshake once every peer has posted; whether it did."""
        if r.connecting is None or self._unconnected(g, r.connecting[1]):
            return False
        r.connecting = None
        return True

    def _host(self, g: int, r: _Rank) -> bool:
        """Post the host's next batch where it is not waiting; whether it did."""
        if r.waiting is not None or r.connecting is not None or r.next >= len(r.batches):
            return False
        i, (_, batch) = r.next, r.batches[r.next]
        r.streams.setdefault(batch.group, []).append(i)
        r.queue.append(i)
        self._dispatch(g, r)
        r.next += 1
        if batch.receives:
            r.waiting = i
        pairs = {(batch.group, op.peer) for op in batch.ops}
        first = sorted(p for p in pairs if (p[0], g, p[1]) not in self.posted)
        self.posted.update((grp, g, peer) for grp, peer in pairs)
        if self.rules.lazy_connect and self._unconnected(g, first):
            r.connecting = (i, tuple(first))
        return True

    def _dispatch(self, g: int, r: _Rank) -> None:
        """Start posted batches that head their communicator's stream; under ``shared_queue`` only
        from the head of the GPU's one queue (a batch waiting for its stream blocks those behind it)."""
        while r.queue:
            i = next((j for j in r.queue if r.streams[r.batches[j][1].group][0] == j), None)
            if i is None or (self.rules.shared_queue and i != r.queue[0]):
                return
            r.queue.remove(i)
            self._start(g, r, i)

    def _start(self, g: int, r: _Rank, i: int) -> None:
        step, batch = r.batches[i]
        slots = []
        for op in batch.ops:
            src, dst = (g, op.peer) if op.send else (op.peer, g)
            mine = self.started.setdefault((batch.group, src, dst, op.send), [])
            mine.append(op)
            slots.append(len(mine) - 1)
            theirs = self.started.get((batch.group, src, dst, not op.send), [])
            n = len(mine) - 1
            if len(theirs) > n and _what(theirs[n]) != _what(op):
                self._mismatch(g, step, op, theirs[n])
        self.slot[(g, i)] = tuple(slots)

    def _open(self, g: int, r: _Rank, i: int) -> list[P2POp]:
        """The operations of started batch ``i`` of ``g`` whose match has not started."""
        _, batch = r.batches[i]
        out = []
        for op, n in zip(batch.ops, self.slot[(g, i)]):
            src, dst = (g, op.peer) if op.send else (op.peer, g)
            if len(self.started.get((batch.group, src, dst, not op.send), [])) <= n:
                out.append(op)
        return out

    def _finish_heads(self, g: int, r: _Rank) -> bool:
        """End every started batch whose operations are all matched; whether one ended."""
        for queue in r.streams.values():
            if queue and (g, queue[0]) in self.slot and not self._open(g, r, queue[0]):
                done = queue.pop(0)
                if r.waiting == done:
                    r.waiting = None
                self._dispatch(g, r)
                return True
        return False

    def _blocked_at(self, r: _Rank) -> tuple[int, int]:
        """(step, batch) the host is stuck on: the batch whose connection it waits for, the batch it
        waits for or, its program done, its oldest unfinished batch."""
        if r.connecting is not None:
            return r.batches[r.connecting[0]][0], r.connecting[0]
        if r.waiting is not None:
            return r.batches[r.waiting][0], r.waiting
        i = min(q[0] for q in r.streams.values() if q)
        return r.batches[i][0], i

    def _name(self, g: int, step: int) -> str:
        return f"step {step} ({self.actions[g][step]})" if step >= 0 else "the warm-up"

    def _blocked_line(self, g: int, r: _Rank) -> tuple[int, str]:
        step, i = self._blocked_at(r)
        where = f"rank {g} {self._name(g, step)}"
        if r.connecting is not None and r.connecting[0] == i:
            peers = ", ".join(
                f"rank {p} on channel {grp}" for grp, p in self._unconnected(g, r.connecting[1])
            )
            return (
                step,
                f"{where} blocks its host connecting to {peers} (lazy connection: no operation there yet)",
            )
        return step, f"{where} {self._waits(g, r, i)}"

    def _waits(self, g: int, r: _Rank, i: int, depth: int = 0) -> str:
        """What unfinished batch ``i`` of ``g`` waits for: its operations' matches once started, else
        the batch ahead of it on its communicator or on the GPU's one queue."""
        if (g, i) in self.slot:
            return "waits on " + ", ".join(str(op) for op in self._open(g, r, i))
        head = r.streams[r.batches[i][1].group][0]
        ahead, where = (head, "its communicator") if head != i else (r.queue[0], "its GPU's one queue")
        behind = f"is queued on {where} behind {self._name(g, r.batches[ahead][0])}"
        return behind + (f", which {self._waits(g, r, ahead, depth + 1)}" if depth < 2 else "")

    def _deadlock(self) -> None:
        blocked, lines = {}, []
        for g, r in self.ranks.items():
            if not r.done:
                step, line = self._blocked_line(g, r)
                blocked[g] = max(step, 0)
                lines.append(line)
        rules = "".join(
            [
                "; a pair connects on its first operations" if self.rules.lazy_connect else "",
                f"; {SHARED_QUEUE_ENV}=1: one queue per GPU" if self.rules.shared_queue else "",
            ]
        )
        head = (
            f"iteration {self.iteration}: deadlock under NCCL semantics (a send completes only when its "
            f"receive is posted; a communicator runs its operations in order{rules}): " + "; ".join(lines)
        )
        raise ScheduleError(head + "\n" + format_grid(self.actions, blocked, primary=min(blocked)))

    def _mismatch(self, g: int, step: int, op: P2POp, other: P2POp) -> None:
        raise ScheduleError(
            f"iteration {self.iteration}: rank {g} {self._name(g, step)}: {op} would be matched with {other} "
            f"of rank {op.peer} (point-to-point operations between two ranks match in issue order)\n"
            + format_grid(self.actions, {g: max(step, 0)})
        )


def check_program(
    programs: dict[int, Sequence[Step]], iteration: int = 0, rules: NcclRules = CONNECTED
) -> None:
    """Replay the programs of the ranks of a replica under NCCL's semantics and ``rules``; raise
    ``ScheduleError`` with the action grid at the first deadlock or mismatched pair of operations.

    The host posts its batches in order; the first post on a pair blocks it until the peer has posted
    on that pair (``rules.lazy_connect``); it waits for each batch with a receive; a stream
    (a communicator's, or the GPU's one under ``rules.shared_queue``) starts its batches one at a time,
    in order; a batch ends when each of its operations' matches has started; at the end every stream
    drains."""
    _Replay(programs, iteration, rules).run()


def check_iteration(
    layout: Layout,
    it: IterationPlan,
    iteration: int = 0,
    forward_only: bool = False,
    rules: NcclRules = REAL_NCCL,
    cross_replica: bool = False,
) -> None:
    """Every replica's programs of ``it`` under ``rules``, each opened by the warm-up (as if it were
    the run's first step: nothing connected yet). With ``cross_replica`` (the run has the channels
    between replicas, ``layout_channels``) every rank's program in one replay, the pieces that cross
    replicas taken where their samples are computed (``check_pieces``); without, an iteration that
    moves encoder work across replicas is an error."""
    pieces = encoder_pieces(layout, it)
    if pieces and not cross_replica:
        moved = sum(len(ids) for (r, _, _), per in pieces.items() for o, ids in per.items() if o != r)
        raise ScheduleError(
            f"iteration {iteration}: {moved} sample(s) cross data-parallel replicas at the encoder -> LLM "
            "boundary, but the run has no channels between replicas (a system whose plans move encoder "
            "work across replicas: SystemSpec.cross_replica_moves)"
        )
    if cross_replica:
        check_pieces(layout, it, pieces, forward_only)
        ranks = range(layout.world_size)
        orders = receiver_orders(layout, it, ranks, forward_only, pieces)
        programs = {
            g: rank_program(
                layout, it, g, forward_only=forward_only, iteration=iteration, warmup=True, cross_replica=True,
                pieces=pieces, orders=orders[g],
            )
            for g in ranks
        }  # fmt: skip
        check_program(programs, iteration, rules)
        return
    for replica in range(layout.dp):
        programs = replica_programs(
            layout, it, replica, forward_only=forward_only, iteration=iteration, warmup=True
        )
        check_program(programs, iteration, rules)


def check_plan(plan: Plan, rules: NcclRules = REAL_NCCL, cross_replica: bool = False) -> None:
    """Every iteration of ``plan``, training and forward-only steps, is deadlock-free under NCCL with
    ``rules`` (default: lazy connection setup, one queue per communicator); ``cross_replica``: the
    run has the channels between replicas (``check_iteration``)."""
    for i, it in enumerate(plan.iterations):
        for forward_only in (False, True):
            check_iteration(plan.layout, it, i, forward_only, rules, cross_replica)


def _index(acts: Sequence[Action], stage: int, kinds, mb: int, sub: int) -> int | None:
    return next(
        (
            i
            for i, a in enumerate(acts)
            if a.stage == stage and a.kind in kinds and (a.mb, a.sub_index) == (mb, sub)
        ),
        None,
    )


def check_pieces(layout: Layout, it: IterationPlan, pieces: Pieces, forward_only: bool = False) -> None:
    """A piece that crosses replicas arrives with its owner's message of the same (mb, sub), before
    the LLM forward of each sample in it, and its gradient leaves with that message's, after their
    backwards (the gradient of each row complete); ScheduleError otherwise."""
    e = layout.num_encoder_stages - 1
    kinds_b = (ActionKind.B, ActionKind.I)
    for (r, p, u), per in pieces.items():
        for o, ids in per.items():
            if o == r:
                continue
            acts = rank_actions(it, layout.global_rank(o, layout.stages[e + 1].pp_rank), forward_only)
            recv = _index(acts, e + 1, (ActionKind.RECV_F,), p, u)
            send = None if forward_only else _index(acts, e + 1, (ActionKind.SEND_B,), p, u)
            where = f"replica {r}'s encoder message ({p}, {u}) to replica {o}"
            if recv is None or (send is None and not forward_only):
                raise ScheduleError(f"{where}: replica {o} has no message ({p}, {u}) to carry it")
            subs = it.microbatches[o][p].llm_subs
            for v in sorted({v for v, sub_ids in enumerate(subs) for sid in ids if sid in sub_ids}):
                fwd = _index(acts, e + 1, (ActionKind.F,), p, v)
                bwd = None if forward_only else _index(acts, e + 1, kinds_b, p, v)
                if fwd is None or fwd < recv or (not forward_only and (bwd is None or bwd > send)):
                    raise ScheduleError(
                        f"{where}: the LLM (sub-)microbatch ({p}, {v}) that takes it runs before it arrives "
                        "or its backward after the gradient is sent back"
                    )
