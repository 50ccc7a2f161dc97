"""Point-to-point programs: the operations a rank issues for its communication actions, and a replay of
every rank's program under NCCL's semantics.

NCCL does not buffer: a send completes only once the peer has posted the matching receive, the
operations of one communicator run in issue order on its stream (a receive queued behind an
unmatched send waits for it), and two ranks match their messages first-in first-out. A Plan that is
sound with buffered sends (``entrain.core.validate``) can deadlock there: with one communicator, a
1F1B middle rank runs ``1SEND_F1 1RECV_B0`` while its successor runs ``2SEND_B0 2RECV_F1``, each
send holding its stream until a receive that the peer has queued behind its own send.

The runtime therefore talks over one group per *channel* (ordered pair of ranks, sender -> receiver):
a send holds only its channel, never a receive from anyone, and never the host, which waits for its
sends at the end of the step. ``rank_program`` turns a rank's action list into that program:

* a message is a fixed-size header (key, dtype, shape, sample-id checksum) and its data; a send
  posts both as one batch; a receive of known size (a gradient has its output's shape) posts both
  as one batch, a forward message first its header (the host reads the size) and then its data;
* receives follow the channel's send order: when an action needs a message that its sender sends
  after others not yet received, those are received first and kept for their own actions (FIFO
  matching cannot deliver a later message first);
* communication with a stage on the same rank is a local hand-over, no operation.

``check_program`` replays the programs of a replica: the host posts its batches in order and waits
for each batch with a receive (a host that runs ahead only posts earlier, which cannot deadlock what
this replay finishes); a group's stream starts its batches one at a time, in order; a batch ends
when each of its operations' matches has started; at the end every stream drains. It raises ``ScheduleError`` with the
``<-- ERROR HERE`` grid (``entrain.core.validate.format_grid``) at the first deadlock, or where FIFO
matching would pair two different operations. Posting only ever adds, so one replay that finishes
means every timing finishes. ``single_group`` gives the programs as one communicator would run them
(the order the runtime used before): the checker finds 1F1B's crossed sends there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from entrain.core.errors import ScheduleError
from entrain.core.plan import Action, ActionKind, IterationPlan, Layout, Plan
from entrain.core.schedules.graph import Message
from entrain.core.validate import format_grid, message_of

__all__ = [
    "P2POp",
    "Batch",
    "Comm",
    "Step",
    "FORWARD_KINDS",
    "rank_program",
    "replica_programs",
    "single_group",
    "check_program",
    "check_iteration",
    "check_plan",
    "receive_needs_header",
    "layout_channels",
]

FORWARD_KINDS = frozenset({ActionKind.F, ActionKind.SEND_F, ActionKind.RECV_F})
"""The actions a forward-only (evaluation) step runs."""

_SENDS = (ActionKind.SEND_F, ActionKind.SEND_B)
Part = Literal["header", "data"]


@dataclass(frozen=True, slots=True)
class P2POp:
    """One send (``send=True``) or receive of ``part`` of ``message`` with plan rank ``peer``."""

    send: bool
    peer: int
    message: Message
    part: Part = "data"

    def __str__(self) -> str:
        act = self.message.send_action() if self.send else self.message.recv_action()
        return f"{act}:{self.part}{'->' if self.send else '<-'}r{self.peer}"


@dataclass(frozen=True, slots=True)
class Batch:
    """Operations posted together (one ``batch_isend_irecv``) on ``group``'s communicator."""

    group: tuple[int, int]
    """The channel ``(sender, receiver)`` (plan ranks) whose group carries the batch."""
    ops: tuple[P2POp, ...]

    @property
    def receives(self) -> bool:
        """Whether the host waits for the batch (it needs what it receives)."""
        return any(not op.send for op in self.ops)


@dataclass(frozen=True, slots=True)
class Comm:
    """A communication action and the batches it posts (none: a local hand-over, or a message
    received earlier in channel order)."""

    action: Action
    step: int
    """Index of ``action`` in the rank's (filtered) action list."""
    batches: tuple[Batch, ...]


Step = Action | Comm
"""A compute action, run as it is, or a communication action."""


def _actions(it: IterationPlan, rank: int, forward_only: bool) -> list[Action]:
    return [a for a in it.actions.get(rank, ()) if not forward_only or a.kind in FORWARD_KINDS]


def _owner(layout: Layout, rank: int, stage: int) -> int:
    replica, _ = layout.replica_of(rank)
    return layout.global_rank(replica, layout.stages[stage].pp_rank)


def _peer(layout: Layout, rank: int, a: Action) -> int:
    msg = message_of(a)
    return _owner(layout, rank, msg.dst if a.kind in _SENDS else msg.src)


def _channel_orders(
    layout: Layout, it: IterationPlan, rank: int, forward_only: bool
) -> dict[int, list[Message]]:
    """Sender (plan rank) -> the messages it sends to ``rank``, in its send order."""
    replica, _ = layout.replica_of(rank)
    orders: dict[int, list[Message]] = {}
    for pp in range(layout.ranks_per_replica):
        sender = layout.global_rank(replica, pp)
        if sender == rank:
            continue
        for a in _actions(it, sender, forward_only):
            if a.kind in _SENDS and _peer(layout, sender, a) == rank:
                orders.setdefault(sender, []).append(message_of(a))
    return orders


def _send_batches(rank: int, peer: int, msg: Message) -> tuple[Batch, ...]:
    return (Batch((rank, peer), (P2POp(True, peer, msg, "header"), P2POp(True, peer, msg, "data"))),)


def _recv_batches(rank: int, peer: int, msg: Message) -> tuple[Batch, ...]:
    head, data = P2POp(False, peer, msg, "header"), P2POp(False, peer, msg, "data")
    if not receive_needs_header(msg):
        return (Batch((peer, rank), (head, data)),)
    return (Batch((peer, rank), (head,)), Batch((peer, rank), (data,)))


class _Builder:
    """One rank's action list -> its steps (see the module docstring)."""

    def __init__(self, layout: Layout, it: IterationPlan, rank: int, forward_only: bool, iteration: int):
        self.layout, self.rank, self.iteration = layout, rank, iteration
        self.actions = _actions(it, rank, forward_only)
        self.orders = _channel_orders(layout, it, rank, forward_only)
        self.position = {(src, m): i for src, msgs in self.orders.items() for i, m in enumerate(msgs)}
        self.received = dict.fromkeys(self.orders, 0)

    def build(self) -> tuple[Step, ...]:
        return tuple(
            a if a.kind.is_compute else Comm(a, i, self._batches(i, a)) for i, a in enumerate(self.actions)
        )

    def _batches(self, step: int, a: Action) -> tuple[Batch, ...]:
        peer, msg = _peer(self.layout, self.rank, a), message_of(a)
        if peer == self.rank:
            return ()  # a hand-over between stages of this rank
        if a.kind in _SENDS:
            return _send_batches(self.rank, peer, msg)
        pos = self.position.get((peer, msg))
        if pos is None:
            raise ScheduleError(
                f"iteration {self.iteration}: rank {self.rank} step {step}: {a} waits for a message rank "
                f"{peer} never sends"
            )
        first, self.received[peer] = self.received[peer], max(self.received[peer], pos + 1)
        return tuple(b for m in self.orders[peer][first : pos + 1] for b in _recv_batches(self.rank, peer, m))


def rank_program(
    layout: Layout, it: IterationPlan, rank: int, *, forward_only: bool = False, iteration: int = 0
) -> tuple[Step, ...]:
    """The steps ``rank`` runs for ``it``: its compute actions and its communication, in order."""
    return _Builder(layout, it, rank, forward_only, iteration).build()


def replica_programs(
    layout: Layout, it: IterationPlan, replica: int, *, forward_only: bool = False, iteration: int = 0
) -> dict[int, tuple[Step, ...]]:
    ranks = [layout.global_rank(replica, pp) for pp in range(layout.ranks_per_replica)]
    return {g: rank_program(layout, it, g, forward_only=forward_only, iteration=iteration) for g in ranks}


def single_group(programs: dict[int, Sequence[Step]]) -> dict[int, tuple[Step, ...]]:
    """The same operations, every batch on one communicator (how a runtime with one group and one
    stream would issue them)."""

    def one(step: Step) -> Step:
        if isinstance(step, Action):
            return step
        return replace(step, batches=tuple(replace(b, group=(-1, -1)) for b in step.batches))

    return {g: tuple(one(s) for s in steps) for g, steps in programs.items()}


# --- the replay -------------------------------------------------------------------------------------


@dataclass
class _Rank:
    """A rank in the replay: its batches in host order, the host's position, and per group the
    queue of posted batches (a communicator's stream: the head batch has started)."""

    batches: list[tuple[int, Batch]]
    """(step, batch) in the order the host posts them."""
    next: int = 0
    waiting: int | None = None
    """Index of the batch the host waits for (one with a receive)."""
    streams: dict[tuple[int, int], list[int]] = field(default_factory=dict)

    @property
    def host_done(self) -> bool:
        return self.next >= len(self.batches) and self.waiting is None

    @property
    def done(self) -> bool:
        return self.host_done and not any(self.streams.values())


class _Replay:
    def __init__(self, programs: dict[int, Sequence[Step]], iteration: int):
        self.iteration = iteration
        self.actions = {
            g: [s if isinstance(s, Action) else s.action for s in steps] for g, steps in programs.items()
        }
        self.ranks = {
            g: _Rank([(s.step, b) for s in steps if isinstance(s, Comm) for b in s.batches])
            for g, steps in programs.items()
        }
        self.started: dict[tuple[tuple[int, int], int, int, bool], list[P2POp]] = {}
        """(group, src, dst, is send) -> the operations started on that channel, in order."""
        self.slot: dict[tuple[int, int], tuple[int, ...]] = {}
        """(rank, batch index) -> channel position of each of its operations, once started."""

    def run(self) -> None:
        while not all(r.done for r in self.ranks.values()):
            if not any([self._progress(g, r) for g, r in self.ranks.items()]):
                self._deadlock()

    def _progress(self, g: int, r: _Rank) -> bool:
        moved = False
        while True:
            step = self._finish_heads(g, r) or self._host(g, r)
            if not step:
                return moved
            moved = True

    def _host(self, g: int, r: _Rank) -> bool:
        """Post the host's next batch where it is not waiting; whether it did."""
        if r.waiting is not None or r.next >= len(r.batches):
            return False
        i, (_, batch) = r.next, r.batches[r.next]
        queue = r.streams.setdefault(batch.group, [])
        queue.append(i)
        if len(queue) == 1:
            self._start(g, r, i)
        r.next += 1
        if batch.receives:
            r.waiting = i
        return True

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
            if len(theirs) > n and (theirs[n].message, theirs[n].part) != (op.message, op.part):
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
            if queue and not self._open(g, r, queue[0]):
                done = queue.pop(0)
                if r.waiting == done:
                    r.waiting = None
                if queue:
                    self._start(g, r, queue[0])
                return True
        return False

    def _blocked_at(self, r: _Rank) -> tuple[int, int]:
        """(step, batch) the host is stuck on: the batch it waits for or, its program done, its
        oldest unfinished batch."""
        if r.waiting is not None:
            return r.batches[r.waiting][0], r.waiting
        i = min(q[0] for q in r.streams.values() if q)
        return r.batches[i][0], i

    def _deadlock(self) -> None:
        blocked, lines = {}, []
        for g, r in self.ranks.items():
            if r.done:
                continue
            step, i = self._blocked_at(r)
            blocked[g] = step
            head = r.streams[r.batches[i][1].group][0]
            what = ", ".join(str(op) for op in self._open(g, r, head))
            if head == i:
                lines.append(f"rank {g} step {step} ({self.actions[g][step]}) waits on {what}")
            else:
                lines.append(
                    f"rank {g} step {step} ({self.actions[g][step]}) is queued on its communicator behind "
                    f"step {r.batches[head][0]}, which waits on {what}"
                )
        head = (
            f"iteration {self.iteration}: deadlock under NCCL semantics (a send completes only when its "
            f"receive is posted; a communicator runs its operations in order): " + "; ".join(lines)
        )
        raise ScheduleError(head + "\n" + format_grid(self.actions, blocked, primary=min(blocked)))

    def _mismatch(self, g: int, step: int, op: P2POp, other: P2POp) -> None:
        raise ScheduleError(
            f"iteration {self.iteration}: rank {g} step {step}: {op} would be matched with {other} of rank "
            f"{op.peer} (point-to-point operations between two ranks match in issue order)\n"
            + format_grid(self.actions, {g: step})
        )


def check_program(programs: dict[int, Sequence[Step]], iteration: int = 0) -> None:
    """Replay the programs of the ranks of a replica under NCCL's semantics; raise ``ScheduleError``
    with the action grid at the first deadlock or mismatched pair of operations."""
    _Replay(programs, iteration).run()


def check_iteration(
    layout: Layout, it: IterationPlan, iteration: int = 0, forward_only: bool = False
) -> None:
    for replica in range(layout.dp):
        check_program(
            replica_programs(layout, it, replica, forward_only=forward_only, iteration=iteration), iteration
        )


def check_plan(plan: Plan) -> None:
    """Every iteration of ``plan``, training and forward-only steps, is deadlock-free under NCCL."""
    for i, it in enumerate(plan.iterations):
        for forward_only in (False, True):
            check_iteration(plan.layout, it, i, forward_only)


def receive_needs_header(msg: Message) -> bool:
    """Whether the receiver must read a message's header before it can post the data receive: a
    forward message carries activations of a size only its sender knows; a gradient has the shape of
    the forward output it belongs to."""
    return msg.kind == "F"


def layout_channels(layout: Layout) -> list[tuple[int, int]]:
    """Every ordered pair (sender, receiver) of plan ranks that messages travel between: one group
    each in the runtime."""
    out: set[tuple[int, int]] = set()
    for replica in range(layout.dp):
        for s in range(len(layout.stages) - 1):
            a = layout.global_rank(replica, layout.stages[s].pp_rank)
            b = layout.global_rank(replica, layout.stages[s + 1].pp_rank)
            if a != b:
                out.update({(a, b), (b, a)})
    return sorted(out)
