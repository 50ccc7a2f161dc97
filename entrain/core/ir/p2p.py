"""Point-to-point programs: the operations a rank issues for its communication actions, and a replay of
every rank's program under NCCL's semantics.

NCCL does not buffer: a send completes only once the peer has posted the matching receive, the
operations of one communicator run in issue order on its stream (a receive queued behind an
unmatched send waits for it), and two ranks match their messages first-in first-out. A Plan that is
sound with buffered sends (``entrain.core.ir.validate``) can deadlock there: with one communicator, a
1F1B middle rank runs ``1SEND_F1 1RECV_B0`` while its successor runs ``2SEND_B0 2RECV_F1``, each
send holding its stream until a receive that the peer has queued behind its own send.

The runtime therefore talks over one group per *channel* (ordered pair of ranks, sender -> receiver):
a send holds only its channel, never a receive from anyone, and never the host, which waits for its
sends at the end of the step. ``rank_program`` turns a rank's action list into that program:

* a message is a set of named parts (``StageSpec.part_names`` of the stage whose forward output it is
  or belongs to: ``"hidden"`` first, then what the family declares), each a fixed-size header (key,
  dtype, shape, sample-id checksum) and its data; a send posts every part's header, then every part's
  data, as one batch; a receive of known size (a gradient has its output's shape) posts them in that
  order as one batch, a forward message first every header (the host reads the sizes) and then every
  part's data (a pair of ranks matches its operations in issue order, within a batch too), unless the
  receiver sizes it from the plan (``rank_program``'s ``known_shape``: then one batch too);
* receives follow the channel's send order: when an action needs a message that its sender sends
  after others not yet received, those are received first and kept for their own actions (FIFO
  matching cannot deliver a later message first);
* communication with a stage on the same rank is a local hand-over, no operation.

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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from entrain.core.errors import ScheduleError
from entrain.core.ir.graph import Message
from entrain.core.ir.plan import Action, ActionKind, IterationPlan, Layout, Plan
from entrain.core.ir.validate import format_grid, message_of
from entrain.core.model.layer_specs import HIDDEN

__all__ = [
    "P2POp",
    "Batch",
    "Comm",
    "Step",
    "WarmUp",
    "NcclRules",
    "warmup_batches",
    "channel_warmup",
    "FORWARD_KINDS",
    "rank_program",
    "replica_programs",
    "single_group",
    "check_program",
    "CONNECTED",
    "REAL_NCCL",
    "SHARED_QUEUE_ENV",
    "rules_from_env",
    "check_iteration",
    "check_plan",
    "receive_needs_header",
    "layout_channels",
    "message_part_names",
    "KnownShape",
    "Pieces",
    "encoder_pieces",
    "check_pieces",
]

FORWARD_KINDS = frozenset({ActionKind.F, ActionKind.SEND_F, ActionKind.RECV_F})
"""The actions a forward-only (evaluation) step runs."""

_SENDS = (ActionKind.SEND_F, ActionKind.SEND_B)
Part = Literal["header", "data", "warmup"]


@dataclass(frozen=True, slots=True)
class P2POp:
    """One send (``send=True``) or receive of ``part`` (header or data) of message part ``tensor`` of
    ``message`` with plan rank ``peer``."""

    send: bool
    peer: int
    message: Message
    part: Part = "data"
    tensor: str = HIDDEN
    """The message part (named tensor) the operation carries."""

    def __str__(self) -> str:
        if self.part == "warmup":
            return f"warm-up{'->' if self.send else '<-'}r{self.peer}"
        act = self.message.send_action() if self.send else self.message.recv_action()
        name = "" if self.tensor == HIDDEN else f"[{self.tensor}]"
        return f"{act}{name}:{self.part}{'->' if self.send else '<-'}r{self.peer}"


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


@dataclass(frozen=True, slots=True)
class WarmUp:
    """The connection warm-up that opens a program: one small send or receive per channel of the rank,
    in ``layout_channels``'s order (the same global order on every rank), so that NCCL's lazy
    connection setup (see ``check_program``) happens while no rank waits on another for anything else."""

    batches: tuple[Batch, ...]


Step = Action | Comm | WarmUp
"""A compute action, run as it is, a communication action, or the connection warm-up."""

_WARMUP_MESSAGE = Message("W", -1, -1, 0, 0)
"""The placeholder message of a warm-up operation (its part is ``"warmup"``)."""


def warmup_batches(layout: Layout, rank: int, cross_replica: bool = False) -> tuple[Batch, ...]:
    """``rank``'s warm-up: for each channel it is on (``layout_channels``), in the global channel
    order, a send (its sender) or a receive (its receiver) of one small tensor. Deadlock-free under
    any setup order: the smallest channel not yet warmed has both its ranks at it."""
    return channel_warmup(layout_channels(layout, cross_replica), rank)


def channel_warmup(channels: Sequence[tuple[int, int]], rank: int) -> tuple[Batch, ...]:
    """``warmup_batches`` over ``channels`` (sorted: the one global order)."""
    out = []
    for src, dst in sorted(channels):
        if rank in (src, dst):
            send = rank == src
            out.append(Batch((src, dst), (P2POp(send, dst if send else src, _WARMUP_MESSAGE, "warmup"),)))
    return tuple(out)


def rank_actions(it: IterationPlan, rank: int, forward_only: bool) -> list[Action]:
    """The actions of ``rank`` in ``it`` (only the forward ones where ``forward_only``), in order."""
    return [a for a in it.actions.get(rank, ()) if not forward_only or a.kind in FORWARD_KINDS]


def _owner(layout: Layout, rank: int, stage: int) -> int:
    replica, _ = layout.replica_of(rank)
    return layout.global_rank(replica, layout.stages[stage].pp_rank)


def _peer(layout: Layout, rank: int, a: Action) -> int:
    msg = message_of(a)
    return _owner(layout, rank, msg.dst if a.kind in _SENDS else msg.src)


Pieces = dict[tuple[int, int, int], dict[int, tuple[str, ...]]]
"""(replica, mb, sub) of a last encoder stage's message -> per replica owning some of its samples (its
own replica first, maybe with none), their ids in the sub's order."""


def encoder_pieces(layout: Layout, it: IterationPlan) -> Pieces:
    """The boundary messages whose samples cross data-parallel replicas (encoder work moved off the
    replica that owns the sample, ``assignment.batchers.rebalance``): each is cut into one piece per owning
    replica, sent to that replica's first LLM stage, whose gradient comes back the same way. A moved
    sample's owner takes it at the same position (its LLM microbatch ``mb``). Empty: nothing moves."""
    e = layout.num_encoder_stages - 1
    if layout.dp < 2 or e < 0 or e + 1 >= len(layout.stages):
        return {}
    owner = {sid: (r, p) for r, specs in enumerate(it.microbatches) for p, spec in enumerate(specs)
             for sid in spec.llm_ids}  # fmt: skip
    out: Pieces = {}
    for r, specs in enumerate(it.microbatches):
        for p, spec in enumerate(specs):
            for u, ids in enumerate(spec.encoder_subs):
                where = [owner.get(sid, (r, p)) for sid in ids]
                if all(o == r for o, _ in where):
                    continue
                pieces: dict[int, tuple[str, ...]] = {r: ()}
                for sid, (o, q) in zip(ids, where):
                    if o != r and q != p:
                        raise ScheduleError(
                            f"sample {sid} is encoded by replica {r} at microbatch {p} but its owner, replica "
                            f"{o}, takes it at microbatch {q}: a moved sample crosses at its own position"
                        )
                    pieces[o] = pieces.get(o, ()) + (sid,)
                out[(r, p, u)] = pieces
    if out and not layout.can_move_encoder_work:
        raise ScheduleError(
            "encoder work moves across replicas on a layout whose encoder and LLM share a rank"
        )
    return out


def _targets(layout: Layout, pieces: Pieces, rank: int, a: Action) -> list[tuple[int, Message]]:
    """(peer, message) of each message communication action ``a`` of ``rank`` sends or receives: its
    own replica's, then the pieces that cross replicas (``encoder_pieces``), by replica."""
    msg = message_of(a)
    own = [(_peer(layout, rank, a), msg)]
    if not pieces:
        return own
    e = layout.num_encoder_stages - 1
    replica, _ = layout.replica_of(rank)
    key = (replica, a.mb, a.sub_index)
    if a.stage == e and a.kind in (ActionKind.SEND_F, ActionKind.RECV_B):
        others = sorted(o for o in pieces.get(key, {}) if o != replica)
        return own + [(layout.global_rank(o, layout.stages[e + 1].pp_rank), msg) for o in others]
    if a.stage == e + 1 and a.kind in (ActionKind.RECV_F, ActionKind.SEND_B):
        others = sorted(r for (r, mb, sub), per in pieces.items() if (mb, sub) == key[1:] and r != replica
                        and replica in per)  # fmt: skip
        return own + [(layout.global_rank(r, layout.stages[e].pp_rank), msg) for r in others]
    return own


def _channel_orders(
    layout: Layout, it: IterationPlan, rank: int, forward_only: bool, pieces: Pieces
) -> dict[int, list[Message]]:
    """Sender (plan rank) -> the messages it sends to ``rank``, in its send order (from every replica
    where pieces cross replicas)."""
    replica, _ = layout.replica_of(rank)
    replicas = range(layout.dp) if pieces else (replica,)
    orders: dict[int, list[Message]] = {}
    for r in replicas:
        for pp in range(layout.ranks_per_replica):
            sender = layout.global_rank(r, pp)
            if sender == rank:
                continue
            for a in rank_actions(it, sender, forward_only):
                if a.kind in _SENDS:
                    for peer, msg in _targets(layout, pieces, sender, a):
                        if peer == rank:
                            orders.setdefault(sender, []).append(msg)
    return orders


def message_part_names(layout: Layout, msg: Message) -> tuple[str, ...]:
    """The parts of ``msg`` in wire order: those of the stage whose forward output it is (a forward
    message) or whose forward output's gradient it is (a gradient message)."""
    return layout.stages[msg.src if msg.kind == "F" else msg.dst].part_names


def _send_batches(rank: int, peer: int, msg: Message, names: Sequence[str]) -> tuple[Batch, ...]:
    ops = tuple(P2POp(True, peer, msg, p, n) for p in ("header", "data") for n in names)
    return (Batch((rank, peer), ops),)


KnownShape = Callable[[Message], bool]
"""Whether the receiver knows a forward message's shape before it arrives (the plan's rows and the
parts' widths and dtypes, ``entrain.runtime.executor``): it then posts every header and data at once."""


def _recv_batches(rank: int, peer: int, msg: Message, names: Sequence[str], known: bool) -> tuple[Batch, ...]:
    heads = tuple(P2POp(False, peer, msg, "header", n) for n in names)
    data = tuple(P2POp(False, peer, msg, "data", n) for n in names)
    if known:  # a forward message the receiver sizes from the plan: no header round trip
        return (Batch((peer, rank), heads + data),)
    if not receive_needs_header(msg):
        return (Batch((peer, rank), heads + data),)
    return (Batch((peer, rank), heads), Batch((peer, rank), data))


class _Builder:
    """One rank's action list -> its steps (see the module docstring)."""

    def __init__(
        self,
        layout: Layout,
        it: IterationPlan,
        rank: int,
        forward_only: bool,
        iteration: int,
        known_shape: KnownShape | None = None,
        pieces: Pieces | None = None,
    ):
        self.layout, self.rank, self.iteration = layout, rank, iteration
        self.known_shape = known_shape
        self.actions = rank_actions(it, rank, forward_only)
        self.pieces = encoder_pieces(layout, it) if pieces is None else pieces
        self.orders = _channel_orders(layout, it, rank, forward_only, self.pieces)
        self.position = {(src, m): i for src, msgs in self.orders.items() for i, m in enumerate(msgs)}
        self.received = dict.fromkeys(self.orders, 0)

    def build(self) -> tuple[Step, ...]:
        return tuple(
            a if a.kind.is_compute else Comm(a, i, self._batches(i, a)) for i, a in enumerate(self.actions)
        )

    def _batches(self, step: int, a: Action) -> tuple[Batch, ...]:
        out: list[Batch] = []
        for peer, msg in _targets(self.layout, self.pieces, self.rank, a):
            if peer == self.rank:
                continue  # a hand-over between stages of this rank
            if a.kind in _SENDS:
                out.extend(_send_batches(self.rank, peer, msg, message_part_names(self.layout, msg)))
            else:
                out.extend(self._receive(step, a, peer, msg))
        return tuple(out)

    def _receive(self, step: int, a: Action, peer: int, msg: Message) -> tuple[Batch, ...]:
        pos = self.position.get((peer, msg))
        if pos is None:
            raise ScheduleError(
                f"iteration {self.iteration}: rank {self.rank} step {step}: {a} waits for a message rank "
                f"{peer} never sends"
            )
        first, self.received[peer] = self.received[peer], max(self.received[peer], pos + 1)
        return tuple(
            b
            for m in self.orders[peer][first : pos + 1]
            for b in _recv_batches(self.rank, peer, m, message_part_names(self.layout, m), self._known(m))
        )

    def _known(self, msg: Message) -> bool:
        return msg.kind == "F" and self.known_shape is not None and self.known_shape(msg)


def rank_program(
    layout: Layout,
    it: IterationPlan,
    rank: int,
    *,
    forward_only: bool = False,
    iteration: int = 0,
    warmup: bool = False,
    known_shape: KnownShape | None = None,
    cross_replica: bool = False,
    pieces: Pieces | None = None,
) -> tuple[Step, ...]:
    """The steps ``rank`` runs for ``it``: its compute actions and its communication, in order; with
    ``warmup``, opened by the connection warm-up (the runtime's first step after building its groups).
    ``known_shape``: the forward messages the receiver sizes itself (one batch, like a gradient's);
    every other forward message reads its headers first. Posting a receive's data with its headers
    only posts earlier, so the replay of the header-first program covers both. ``cross_replica``: the
    run has the channels between replicas that moved encoder work needs (``layout_channels``), which
    the warm-up connects too. ``pieces``: ``encoder_pieces(layout, it)`` when the caller has it already
    (every rank's program at once)."""
    steps = _Builder(layout, it, rank, forward_only, iteration, known_shape, pieces).build()
    head = warmup_batches(layout, rank, cross_replica) if warmup else ()
    return ((WarmUp(head),) if head else ()) + steps


def replica_programs(
    layout: Layout,
    it: IterationPlan,
    replica: int,
    *,
    forward_only: bool = False,
    iteration: int = 0,
    warmup: bool = False,
) -> dict[int, tuple[Step, ...]]:
    ranks = [layout.global_rank(replica, pp) for pp in range(layout.ranks_per_replica)]
    return {
        g: rank_program(layout, it, g, forward_only=forward_only, iteration=iteration, warmup=warmup)
        for g in ranks
    }


def single_group(programs: dict[int, Sequence[Step]]) -> dict[int, tuple[Step, ...]]:
    """The same operations, every batch on one communicator (how a runtime with one group and one
    stream would issue them)."""

    def one(step: Step) -> Step:
        if isinstance(step, Action):
            return step
        if isinstance(step, WarmUp):
            return WarmUp(tuple(replace(b, group=(-1, -1)) for b in step.batches))
        return replace(step, batches=tuple(replace(b, group=(-1, -1)) for b in step.batches))

    return {g: tuple(one(s) for s in steps) for g, steps in programs.items()}


# --- the replay -------------------------------------------------------------------------------------


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
        programs = {
            g: rank_program(
                layout, it, g, forward_only=forward_only, iteration=iteration, warmup=True, cross_replica=True
            )
            for g in ranks
        }
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


def receive_needs_header(msg: Message) -> bool:
    """Whether the receiver must read a message's header before it can post the data receive: a
    forward message carries activations of a size only its sender knows; a gradient has the shape of
    the forward output it belongs to."""
    return msg.kind == "F"


def layout_channels(layout: Layout, cross_replica: bool = False) -> list[tuple[int, int]]:
    """Every ordered pair (sender, receiver) of plan ranks that messages travel between: one group
    each in the runtime. ``cross_replica``: also from each replica's last encoder rank to every other
    replica's first LLM rank and back (encoder work moved across replicas, ``encoder_pieces``)."""
    out: set[tuple[int, int]] = set()
    e = layout.num_encoder_stages - 1
    if cross_replica and 0 <= e < len(layout.stages) - 1:
        for r in range(layout.dp):
            for o in range(layout.dp):
                a = layout.global_rank(r, layout.stages[e].pp_rank)
                b = layout.global_rank(o, layout.stages[e + 1].pp_rank)
                if r != o and a != b:
                    out.update({(a, b), (b, a)})
    for replica in range(layout.dp):
        for s in range(len(layout.stages) - 1):
            a = layout.global_rank(replica, layout.stages[s].pp_rank)
            b = layout.global_rank(replica, layout.stages[s + 1].pp_rank)
            if a != b:
                out.update({(a, b), (b, a)})
    return sorted(out)
