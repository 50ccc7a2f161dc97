"""Point-to-point programs: the operations a rank issues for its communication actions.

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

``entrain.core.ir.p2p_check`` replays these programs under NCCL's semantics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from entrain.core.errors import ScheduleError
from entrain.core.ir.graph import Message
from entrain.core.ir.plan import Action, ActionKind, IterationPlan, Layout
from entrain.core.ir.validate import message_of, messages_of
from entrain.core.model.layer_specs import HIDDEN

__all__ = [
    "P2POp",
    "Batch",
    "Comm",
    "Step",
    "WarmUp",
    "warmup_batches",
    "channel_warmup",
    "FORWARD_KINDS",
    "rank_program",
    "rank_events",
    "Event",
    "receiver_orders",
    "replica_programs",
    "single_group",
    "receive_needs_header",
    "layout_channels",
    "message_part_names",
    "KnownShape",
    "Pieces",
    "encoder_pieces",
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
    if layout.multi_encoder:  # one message per encoder at the first LLM stage; no pieces
        return [
            (_owner(layout, rank, m.dst if a.kind in _SENDS else m.src), m) for m in messages_of(layout, a)
        ]
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


def receiver_orders(
    layout: Layout, it: IterationPlan, ranks: Sequence[int], forward_only: bool, pieces: Pieces
) -> dict[int, dict[int, list[Message]]]:
    """Per rank of ``ranks``: sender (plan rank) -> the messages it sends to that rank, in its send order,
    from the rank's own replica, or from every replica where pieces cross replicas; one
    ``_channel_orders`` pass over those senders for every rank asked."""
    if pieces:
        senders: Sequence[int] = range(layout.world_size)
    else:
        replicas = sorted({layout.replica_of(g)[0] for g in ranks})
        senders = [layout.global_rank(r, pp) for r in replicas for pp in range(layout.ranks_per_replica)]
    orders = _channel_orders(layout, it, senders, forward_only, pieces)
    return {g: orders.get(g, {}) for g in ranks}


def _channel_orders(
    layout: Layout, it: IterationPlan, senders: Sequence[int], forward_only: bool, pieces: Pieces
) -> dict[int, dict[int, list[Message]]]:
    """Receiver -> sender -> the messages the sender sends it, in its send order, over ``senders``, in one
    pass over their send actions (``receiver_orders`` picks the senders a rank hears from)."""
    out: dict[int, dict[int, list[Message]]] = {}
    for sender in senders:
        for a in rank_actions(it, sender, forward_only):
            if a.kind in _SENDS:
                for peer, msg in _targets(layout, pieces, sender, a):
                    if peer != sender:
                        out.setdefault(peer, {}).setdefault(sender, []).append(msg)
    return out


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


class Event(NamedTuple):
    """One message a step of a rank's program sends to (``send``) or receives from ``peer``."""

    peer: int
    message: Message
    send: bool


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
        orders: dict[int, list[Message]] | None = None,
    ):
        self.layout, self.rank, self.iteration = layout, rank, iteration
        self.known_shape = known_shape
        self.actions = rank_actions(it, rank, forward_only)
        self.pieces = encoder_pieces(layout, it) if pieces is None else pieces
        if orders is None:
            orders = receiver_orders(layout, it, [rank], forward_only, self.pieces)[rank]
        self.orders = orders
        self.position = {(src, m): i for src, msgs in self.orders.items() for i, m in enumerate(msgs)}
        self.received = dict.fromkeys(self.orders, 0)

    def events(self) -> tuple[tuple[Event, ...] | None, ...]:
        """Per step, ``None`` for a compute action, else the messages (``Event``) its operations carry."""
        return tuple(None if a.kind.is_compute else self._events(i, a) for i, a in enumerate(self.actions))

    def build(self) -> tuple[Step, ...]:
        return tuple(
            a if ev is None else Comm(a, i, self._batches(ev))
            for i, (a, ev) in enumerate(zip(self.actions, self.events()))
        )

    def _events(self, step: int, a: Action) -> tuple[Event, ...]:
        out: list[Event] = []
        for peer, msg in _targets(self.layout, self.pieces, self.rank, a):
            if peer == self.rank:
                continue  # a hand-over between stages of this rank
            if a.kind in _SENDS:
                out.append(Event(peer, msg, True))
            else:
                out.extend(Event(peer, m, False) for m in self._receive(step, a, peer, msg))
        return tuple(out)

    def _batches(self, events: tuple[Event, ...]) -> tuple[Batch, ...]:
        out: list[Batch] = []
        for peer, msg, send in events:
            names = message_part_names(self.layout, msg)
            if send:
                out.extend(_send_batches(self.rank, peer, msg, names))
            else:
                out.extend(_recv_batches(self.rank, peer, msg, names, self._known(msg)))
        return tuple(out)

    def _receive(self, step: int, a: Action, peer: int, msg: Message) -> list[Message]:
        """The messages from ``peer`` this receive takes: ``msg`` and those its channel sends before it
        that no earlier receive took (FIFO matching)."""
        pos = self.position.get((peer, msg))
        if pos is None:
            raise ScheduleError(
                f"iteration {self.iteration}: rank {self.rank} step {step}: {a} waits for a message rank "
                f"{peer} never sends"
            )
        first, self.received[peer] = self.received[peer], max(self.received[peer], pos + 1)
        return self.orders[peer][first : pos + 1]

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
    orders: dict[int, list[Message]] | None = None,
) -> tuple[Step, ...]:
    """The steps ``rank`` runs for ``it``: its compute actions and its communication, in order; with
    ``warmup``, opened by the connection warm-up (the runtime's first step after building its groups).
    ``known_shape``: the forward messages the receiver sizes itself (one batch, like a gradient's);
    every other forward message reads its headers first. Posting a receive's data with its headers
    only posts earlier, so the replay of the header-first program covers both. ``cross_replica``: the
    run has the channels between replicas that moved encoder work needs (``layout_channels``), which
    the warm-up connects too. ``pieces``: ``encoder_pieces(layout, it)`` when the caller has it already
    (every rank's program at once); ``orders``: the rank's ``receiver_orders`` likewise."""
    steps = _Builder(layout, it, rank, forward_only, iteration, known_shape, pieces, orders).build()
    head = warmup_batches(layout, rank, cross_replica) if warmup else ()
    return ((WarmUp(head),) if head else ()) + steps


def rank_events(
    layout: Layout,
    it: IterationPlan,
    rank: int,
    *,
    forward_only: bool = False,
    pieces: Pieces | None = None,
    orders: dict[int, list[Message]] | None = None,
) -> tuple[tuple[Event, ...] | None, ...]:
    """Per step of ``rank_program`` (without warm-up), the messages it sends and receives (``None`` for
    a compute step): what the program's batches carry, without building them."""
    return _Builder(layout, it, rank, forward_only, 0, None, pieces, orders).events()


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
    pieces = encoder_pieces(layout, it)
    orders = receiver_orders(layout, it, ranks, forward_only, pieces)
    return {
        g: rank_program(
            layout, it, g, forward_only=forward_only, iteration=iteration, warmup=warmup, pieces=pieces,
            orders=orders[g],
        )
        for g in ranks
    }  # fmt: skip


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
            nxt = layout.next_stage(s)
            if nxt is None:
                continue
            a = layout.global_rank(replica, layout.stages[s].pp_rank)
            b = layout.global_rank(replica, layout.stages[nxt].pp_rank)
            if a != b:
                out.update({(a, b), (b, a)})
    return sorted(out)
