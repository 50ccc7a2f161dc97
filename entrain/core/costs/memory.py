"""A stage's memory and activation recomputation, as Algorithm 2 checks them.

A stage's memory: weights + gradients + Adam states of trainable layers, bf16 weights of frozen ones,
divided by TP (K/V projections replicated when TP exceeds the KV heads: ``LayerCost.rank_param_bytes``), plus the activations of its 1F1B in-flight microbatches; each stage takes the cheapest
``costmodel.RECOMPUTE_MODES`` entry that fits (``choose_recompute``).

Point-to-point messages in flight (``in_flight_message_bytes``): what a rank holds of its messages
besides its activations, from a Plan's action lists: a sent message until its send has completed, a
received one until the compute action that takes it. A rank's peak memory is the most, over the steps
of its program, of what it holds at that step: activations and messages together
(``peak_with_messages``), the one count the simulated memory check and the planner's fit both use
(``entrain.sim.metrics.SystemMetrics.fits_memory``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from entrain.core.costs.costmodel import RECOMPUTE_MODES, CostModel
from entrain.core.costs.sampler import Sampler, SampleStats
from entrain.core.costs.table_work import draw_works
from entrain.core.errors import ScheduleError
from entrain.core.ir.graph import Message
from entrain.core.ir.p2p import encoder_pieces, rank_actions, rank_events, receiver_orders
from entrain.core.ir.plan import Action, ActionKind, IterationPlan, Layout
from entrain.core.workload.work import SampleWork

__all__ = [
    "ADAM_BYTES_PER_BF16_WEIGHT_BYTE",
    "MicrobatchLoad",
    "microbatch_load",
    "stage_memory_bytes",
    "recompute_ms",
    "choose_recompute",
    "MEMORY_CHECK_REPLICA_ITERATIONS",
    "MEMORY_CHECK_REPLICA_MICROBATCHES",
    "memory_check_iterations",
    "MEMORY_CHECK_ITERATIONS",
    "check_seed",
    "heaviest_batches",
    "check_batches",
    "MessageBytes",
    "plan_message_bytes",
    "in_flight_message_bytes",
    "peak_in_flight_message_bytes",
    "peak_with_messages",
]

ADAM_BYTES_PER_BF16_WEIGHT_BYTE = 9.0
"""Trainable layer: bf16 weight (2) + fp32 gradient (4) + fp32 master, m, v (12) = 18 bytes per
parameter = 9x its bf16 ``param_bytes``."""


@dataclass(frozen=True, slots=True)
class MicrobatchLoad:
    """What a stage plans for: a mean microbatch's tokens (and squared unit lengths) on one component,
    held ``in_flight`` times, and the largest microbatch's, which a recomputing backward expands."""

    tokens: float
    tokens_sq: float
    peak_tokens: float
    peak_tokens_sq: float


def microbatch_load(stats: SampleStats, comp: str, microbatch_size: int) -> MicrobatchLoad:
    """Mean microbatch = ``microbatch_size`` mean samples; largest = ``microbatch_size`` copies of the
    profile's largest sample on ``comp`` (0 for raw-work profiles: no token metadata)."""
    if not stats.has_tokens:
        return MicrobatchLoad(0.0, 0.0, 0.0, 0.0)
    mean_x1, mean_x2, peak_x1, peak_x2 = stats.column_summary(comp)
    u = microbatch_size
    return MicrobatchLoad(u * mean_x1, u * mean_x2, u * peak_x1, u * peak_x2)


def _params_bytes(cost: CostModel, comp: str, first: int, end: int, tp: int, ep: int = 1) -> float:
    def compute() -> float:
        layers = cost.component(comp).layers[first:end]
        factor = ADAM_BYTES_PER_BF16_WEIGHT_BYTE
        return sum(layer.rank_param_bytes(tp, ep) * (factor if layer.trainable else 1.0) for layer in layers)

    return _cost_memo(cost, ("params", comp, first, end, tp, ep), compute)


_COST_MEMO: dict[tuple, tuple[CostModel, object]] = {}
_COST_MEMO_MAX_ENTRIES = 200_000


def _cost_memo(cost: CostModel, key: tuple, compute: Callable[[], object]):
    """``compute()`` once per cost model and ``key``: what Algorithm 2 asks the cost model again and
    again for the same stage (model state, kept bytes, recomputation coefficients)."""
    full = (id(cost), *key)
    hit = _COST_MEMO.get(full)
    if hit is not None and hit[0] is cost:
        return hit[1]
    if len(_COST_MEMO) >= _COST_MEMO_MAX_ENTRIES:
        _COST_MEMO.clear()
    value = compute()
    _COST_MEMO[full] = (cost, value)
    return value


def stage_memory_bytes(
    cost: CostModel, comp: str, first: int, end: int, tp: int, cp: int, load: MicrobatchLoad, in_flight: int,
    recompute: str = "none", ep: int = 1,
) -> float:  # fmt: skip
    """One GPU of a stage: model state (weights + gradients + Adam states of trainable layers, bf16
    weights of frozen ones, / TP; a mixture-of-experts layer's experts also / ``ep``) + ``in_flight``
    mean microbatches' kept activations (a sparse layer's: its ``top_k`` active experts') + the largest
    microbatch's recomputation transient (``CostModel.recompute_transient_bytes``), / (TP x CP)."""
    lin, sq = _cost_memo(cost, ("kept", comp, first, end, recompute),
                         lambda: cost.kept_bytes_per_token(comp, first, end, recompute))  # fmt: skip
    held = in_flight * (load.tokens * lin + load.tokens_sq * sq)
    dropped = _cost_memo(cost, ("dropped", comp, first, end, recompute),
                         lambda: cost.recompute_dropped_bytes_per_token(comp, first, end, recompute))  # fmt: skip
    # CostModel.recompute_transient_bytes on the cached per-layer coefficients
    transient = max([0.0, *(lin * load.peak_tokens + sq * load.peak_tokens_sq for lin, sq in dropped)])
    return _params_bytes(cost, comp, first, end, tp, ep) + (held + transient) / (tp * cp)


def recompute_ms(
    stats: SampleStats, cost: CostModel, comp: str, first: int, end: int, tp: int, cp: int, u: int, mode: str
) -> float:
    """Recomputation ms of a mean ``u``-sample microbatch on layers ``[first, end)`` (one call); an audio
    tower's rows are not recomputed (``CostModel.recompute_ms`` re-runs the encoder's layers over the
    vision rows: ``SampleStats.tower_split``)."""
    if mode == "none" or not stats.has_tokens:
        return 0.0
    mean_x1, mean_x2 = stats.column_summary("vision" if stats.tower_split(cost, comp) else comp)[:2]
    total = 0.0
    for a, b, c in _recompute_coefficients(cost, comp, first, end, tp, cp, mode):
        total += u * (a * mean_x2 + b * mean_x1) + c
    return total


def _recompute_coefficients(cost: CostModel, comp: str, first: int, end: int, tp: int, cp: int, mode: str):
    """Per layer of ``[first, end)``: the ``(a, b, c)`` of its recomputation ms (``CostModel.recompute_ms``
    at 1 and 2 units, and one call's constant), cached per cost model."""

    def compute() -> tuple[tuple[float, float, float], ...]:
        out = []
        for i in range(first, end):
            g1 = cost.recompute_ms(comp, i, (1,), mode, tp, cp, 0)
            g2 = cost.recompute_ms(comp, i, (2,), mode, tp, cp, 0)
            a = (g2 - 2.0 * g1) / 2.0
            out.append((a, g1 - a, cost.recompute_ms(comp, i, (), mode, tp, cp, 1)))
        return tuple(out)

    return _cost_memo(cost, ("recompute", comp, first, end, tp, cp, mode), compute)


def choose_recompute(
    stats: SampleStats, cost: CostModel, comp: str, first: int, end: int, tp: int, cp: int, u: int,
    in_flight: int, limit_bytes: float, ep: int = 1,
) -> tuple[str, float, float]:  # fmt: skip
    """(mode, memory bytes, recomputation ms) of the cheapest ``RECOMPUTE_MODES`` entry whose stage
    memory fits ``limit_bytes``; ``full`` (not fitting) when none does."""
    load = microbatch_load(stats, comp, u)
    for mode in RECOMPUTE_MODES:
        mem = stage_memory_bytes(cost, comp, first, end, tp, cp, load, in_flight, mode, ep)
        if mem <= limit_bytes or mode == RECOMPUTE_MODES[-1]:
            return mode, mem, recompute_ms(stats, cost, comp, first, end, tp, cp, u, mode)
    raise AssertionError("unreachable")


MEMORY_CHECK_REPLICA_ITERATIONS = 80
"""(replica, iteration) pairs the plan's simulated memory check needs to see: what ``--iterations 20``
gives on the paper's DP 4 (docs/planning_scale.md)."""


MEMORY_CHECK_REPLICA_MICROBATCHES = MEMORY_CHECK_REPLICA_ITERATIONS * 32
"""(replica, microbatch) pairs that are as many as the paper's setup checks (80 replica iterations of
32 microbatches): enough where a replica iteration holds many more microbatches (low DP at a large
global batch: 512 a replica at DP 4 and global batch 8192)."""


def memory_check_iterations(
    dp: int,
    iterations: int,
    replica_iterations: int = MEMORY_CHECK_REPLICA_ITERATIONS,
    num_microbatches: int | None = None,
    replica_microbatches: int = MEMORY_CHECK_REPLICA_MICROBATCHES,
) -> int:
    """Global batches the plan's simulated memory check draws: the fewest that hold at least
    ``replica_iterations`` (replica, iteration) pairs or, given ``num_microbatches`` per replica, at
    least ``replica_microbatches`` (replica, microbatch) pairs; at most ``iterations``, at least 1.
    A rank's peak is set by the microbatches it holds at once, and a replica iteration of K
    microbatches passes K such windows: at DP 4 with 512 microbatches a replica, 2 global batches
    hold 4096 pairs (20 held 40960 and took minutes to simulate).

    Each pair is an exchangeable draw of a replica's microbatches, so the chance that a fresh pair
    peaks above every one of ``R`` simulated pairs is at most ``1 / (R + 1)``: with ``R`` >= 80 the
    check keeps the guarantee it has on the paper's setup (20 iterations of 4 replicas) while
    simulating 2 global batches instead of 20 at DP 64."""
    dp = max(int(dp), 1)
    need = -(-int(replica_iterations) // dp)
    if num_microbatches:
        need = min(need, -(-int(replica_microbatches) // (dp * int(num_microbatches))))
    return max(1, min(int(iterations), need))


MEMORY_CHECK_ITERATIONS = 20
"""Global batches the memory check draws at most by default: ``plan``'s and ``simulate``'s default
``--iterations`` (``cli.common``'s flag) and what ``train`` without ``--plan`` checks on."""


def check_seed(seed: int, i: int) -> int:
    """The sampler seed of the memory check's ``i``-th global batch (0-based) for the run's ``--seed``."""
    return seed * 1_000_003 + 7_919 * (i + 1)


def heaviest_batches(batches: Sequence[Sequence[SampleWork]], num: int, window: int) -> list[int]:
    """Indices (ascending) of the ``num`` batches whose ``window`` heaviest samples on either
    component weigh the most (each component's sums as fractions of their largest over the batches;
    ties: the earlier batch): the batches holding the largest samples, which set a rank's memory peak
    (``window``: the samples a rank holds at once, microbatch size x pipeline ranks)."""
    sums = np.array(
        [[sum(sorted((getattr(s, c) for s in b), reverse=True)[:window]) for c in ("encoder", "llm")]
         for b in batches]
    )  # fmt: skip
    scale = sums.max(axis=0)
    score = (sums / np.where(scale > 0, scale, 1.0)).max(axis=1)
    return sorted(np.argsort(-score, kind="stable")[:num].tolist())


def check_batches(
    sampler: Sampler, cost: CostModel, layout: Layout, global_batch: int, seed: int, iterations: int
) -> list[list[SampleWork]]:
    """The global batches the simulated memory check of ``layout`` deploys on, the one rule of ``plan``
    and ``train`` (its recomputation, Entrain's ``encoder towers`` decision, the memory fit of one
    pipeline per tower), whatever ``train``'s ``--steps``: the planner's seeded sampler's draws
    (``check_seed``; with replacement: a file may hold fewer samples than the check needs), priced at
    the layout's encoder TP (1 with one pipeline per tower, whose callers re-price each tower) as
    ``simulate`` prices its batches: the first ``memory_check_iterations`` of ``iterations`` at the
    layout's DP (all of them up to DP 4 at 32 microbatches a replica; at DP 64, 2 global batches still
    hold 128 replica iterations). Where a replica iteration holds so many microbatches that fewer
    batches hold as many replica microbatches (DP 4 with 512 a replica: 2), those fewer are the
    heaviest of the batches drawn (``heaviest_batches`` over the layout's microbatch size x pipeline
    ranks: the largest samples set a rank's peak). A sample drawn twice is two samples of the batch
    (ids made unique)."""
    encoder = layout.components.get("encoder")
    tp = encoder.tp if encoder is not None else 1
    num = memory_check_iterations(layout.dp, iterations)
    batches = [
        draw_works(sampler(global_batch, check_seed(seed, i)), cost, tp, numbered=True) for i in range(num)
    ]
    fewer = memory_check_iterations(layout.dp, iterations, num_microbatches=layout.num_microbatches)
    if fewer < num:
        window = layout.microbatch_size * layout.ranks_per_replica
        batches = [batches[i] for i in heaviest_batches(batches, fewer, window)]
    return batches


MessageBytes = Callable[[int, int, Message], float]
"""``(sender plan rank, receiver plan rank, message) -> bytes``: every part of a message (a gradient
has its forward output's size; ``plan_message_bytes``)."""


def plan_message_bytes(costs, it: IterationPlan, pieces=None) -> MessageBytes:
    """``MessageBytes`` of ``it`` under ``costs`` (a ``schedules.action_costs.PlanCosts``): the forward
    output's ``message_bytes`` for the samples it carries, a piece's where encoder work crosses
    replicas (``entrain.core.ir.p2p.encoder_pieces``; ``pieces``: those, or ``{}`` for none)."""
    from entrain.core.ir.graph import ReplicaGraph

    layout = costs.layout
    pieces = encoder_pieces(layout, it) if pieces is None else pieces
    graphs: dict[int, ReplicaGraph] = {}

    def size(sender: int, receiver: int, msg: Message) -> float:
        out = msg.src if msg.kind == "F" else msg.dst
        enc_side = sender if msg.kind == "F" else receiver
        replica = layout.replica_of(enc_side)[0]
        per = pieces.get((replica, msg.mb, msg.sub)) if out == layout.num_encoder_stages - 1 else None
        if per is not None:
            ids = per.get(layout.replica_of(receiver if msg.kind == "F" else sender)[0], ())
        else:
            graph = graphs.get(replica) or graphs.setdefault(
                replica, ReplicaGraph(layout, it.microbatches[replica])
            )
            ids = graph.ids(out, msg.mb, msg.sub)
        return costs.message_bytes(out, ids)

    return size


def _program_events(events: dict[int, tuple]) -> tuple[dict, dict]:
    """(sender, receiver, message) -> the sender's step that posts it, and the receiver's step that
    receives it (a message received ahead of its own action, in its channel's order, at that step).
    ``events``: per rank, ``entrain.core.ir.p2p.rank_events``."""
    sent, received = {}, {}
    for g, steps in events.items():
        for i, step in enumerate(steps):
            for peer, msg, send in step or ():
                if send:
                    sent.setdefault((g, peer, msg), i)
                else:
                    received.setdefault((peer, g, msg), i)
    return sent, received


class _Clocks:
    """Vector clocks of every rank's program (per step, per rank the last step that happens before it:
    program order and messages, a receive after its send), kept only at the steps that receive: between
    two of them a rank's clock changes only in its own entry."""

    def __init__(self, ranks: Sequence[int], sent: dict, received: dict):
        incoming: dict[int, dict[int, list[tuple[int, int]]]] = {g: {} for g in ranks}
        for (src, dst, msg), i in received.items():
            incoming[dst].setdefault(i, []).append((src, sent[(src, dst, msg)]))
        self.marks = {g: sorted(incoming[g]) for g in ranks}
        self.clocks: dict[int, list[dict[int, int]]] = {g: [] for g in ranks}
        self._columns: dict[tuple[int, int], list[int]] = {}
        moved = True
        while moved:
            moved = False
            for g in ranks:
                moved |= self._advance(g, incoming[g])
        stuck = [g for g in ranks if len(self.clocks[g]) < len(self.marks[g])]
        if stuck:
            raise ScheduleError(f"ranks {stuck} wait for messages that are never sent (a cycle)")

    def _advance(self, g: int, incoming: dict[int, list[tuple[int, int]]]) -> bool:
        """Compute ``g``'s clocks at its next receiving steps whose senders' clocks are known."""
        marks, clocks, moved = self.marks[g], self.clocks[g], False
        while len(clocks) < len(marks):
            i = marks[len(clocks)]
            deps = incoming[i]
            if any(not self._known(src, j) for src, j in deps):
                break
            vc = dict(clocks[-1]) if clocks else {}
            for src, j in deps:
                k = bisect_right(self.marks[src], j) - 1
                for r, step in self.clocks[src][k].items() if k >= 0 else ():
                    if step > vc.get(r, -1):
                        vc[r] = step
                if j > vc.get(src, -1):
                    vc[src] = j
            vc[g] = i
            clocks.append(vc)
            moved = True
        return moved

    def _known(self, g: int, step: int) -> bool:
        """Whether ``g``'s clock at ``step`` is computed: every receiving step up to it is."""
        marks, done = self.marks[g], len(self.clocks[g])
        return done == len(marks) or marks[done] > step

    def first_after(self, g: int, step: int, other: int, other_step: int, end: int) -> int:
        """The first step of ``g`` from ``step`` on that ``other``'s ``other_step`` happens before
        (``end`` when none). ``other`` != ``g``: that entry changes only at receiving steps."""
        column = self._columns.get((g, other))
        if column is None:
            column = self._columns[(g, other)] = [vc.get(other, -1) for vc in self.clocks[g]]
        marks = self.marks[g]
        lo = bisect_left(marks, step)
        if lo and column[lo - 1] >= other_step:
            return step
        k = bisect_left(column, other_step, lo=lo)
        return marks[k] if k < len(marks) else end


def _compute_index(steps: tuple) -> tuple[dict, dict]:
    """A program's compute steps by (stage, forward?) and by (stage, forward?, mb, sub), in order."""
    by_stage: dict[tuple, list[int]] = {}
    by_task: dict[tuple, list[int]] = {}
    for i, step in enumerate(steps):
        if isinstance(step, Action) and step.kind in (ActionKind.F, ActionKind.B, ActionKind.I):
            key = (step.stage, step.kind is ActionKind.F)
            by_stage.setdefault(key, []).append(i)
            by_task.setdefault((*key, step.mb, step.sub_index), []).append(i)
    return by_stage, by_task


def _consumer(steps: tuple, start: int, msg: Message, index: tuple[dict, dict] | None = None) -> int:
    """The compute step of the receiver that takes ``msg`` (received at ``start``): its stage's
    forward (a forward message) or backward of the same microbatch and sub, else the first of that
    kind after it (an encoder message several LLM microbatches take); the end when none. ``index``:
    ``_compute_index(steps)``, when the caller has it."""
    by_stage, by_task = index or _compute_index(steps)
    key = (msg.dst, msg.kind == "F")
    for found in (by_task.get((*key, msg.mb, msg.sub), ()), by_stage.get(key, ())):
        k = bisect_right(found, start)
        if k < len(found):
            return found[k]
    return len(steps)


def in_flight_message_bytes(
    layout: Layout, it: IterationPlan, message_bytes: MessageBytes, *, forward_only: bool = False, pieces=None
) -> dict[int, list[float]]:
    """Per plan rank, after each step of its point-to-point program (``entrain.core.ir.p2p.rank_program``,
    one step per action), the bytes of the messages it holds in flight:

    * a sent message from its send until the first step of the sender that the receiver's receive
      happens before (NCCL: a send completes once its receive is posted; the runtime drops a sent
      tensor once its send has completed, ``Transport.release_sent``), or the end of the step;
    * a received message from its receive (ahead of its own action when its channel's order says so)
      until the compute action that takes it (``_consumer``), where it becomes that stage's input.

    A hand-over between stages of one rank holds nothing. ``pieces``: ``encoder_pieces(layout, it)``,
    or ``{}`` to count every replica's own messages alone (where pieces cannot be sent: see there)."""
    pieces = encoder_pieces(layout, it) if pieces is None else pieces
    p = layout.ranks_per_replica
    groups = (
        [list(range(layout.world_size))]
        if pieces
        else [[r * p + pp for pp in range(p)] for r in range(layout.dp)]
    )
    held: dict[int, list[float]] = {}
    for ranks in groups:
        base = ranks[0]
        for (src, dst, msg), (i, end), (j, took) in _holds(layout, it, ranks, pieces, forward_only):
            src, dst = src + base, dst + base
            size = message_bytes(src, dst, msg)
            for g, lo, hi in ((src, i, end), (dst, j, took)):
                steps = held.get(g) or held.setdefault(g, [0.0] * len(rank_actions(it, g, forward_only)))
                for k in range(lo, hi):
                    steps[k] += size
    for g in range(layout.world_size):
        held.setdefault(g, [0.0] * len(rank_actions(it, g, forward_only)))
    return held


_HOLDS: dict[tuple, tuple] = {}
_HOLDS_MAX_ENTRIES = 256


def _holds(layout: Layout, it: IterationPlan, ranks: list[int], pieces, forward_only: bool) -> tuple:
    """Per message among ``ranks`` (relative to ``ranks[0]``): ``((src, dst, message), (the sender's
    first and end step holding it), (the receiver's))``. A replica's holds depend only on its ranks'
    action lists where no encoder piece crosses replicas: cached per layout shape and action lists
    (every replica of a 1F1B plan has the same)."""
    key = None
    if not pieces:
        shape = tuple((st.component, st.pp_rank) for st in layout.stages)
        key = (shape, forward_only, tuple(tuple(rank_actions(it, g, forward_only)) for g in ranks))
        hit = _HOLDS.get(key)
        if hit is not None:
            return hit
    orders = receiver_orders(layout, it, ranks, forward_only, pieces)
    events = {
        g: rank_events(layout, it, g, forward_only=forward_only, pieces=pieces, orders=orders[g])
        for g in ranks
    }
    sent, received = _program_events(events)
    clocks = _Clocks(ranks, sent, received)
    actions = {g: rank_actions(it, g, forward_only) for g in ranks}
    index = {g: _compute_index(actions[g]) for g in ranks}
    base = ranks[0]
    out = []
    for (src, dst, msg), i in sent.items():
        j = received[(src, dst, msg)]
        end = clocks.first_after(src, i, dst, j, len(events[src]))
        took = _consumer(actions[dst], j, msg, index[dst])
        out.append(((src - base, dst - base, msg), (i, end), (j, took)))
    holds = tuple(out)
    if key is not None:
        if len(_HOLDS) >= _HOLDS_MAX_ENTRIES:
            _HOLDS.clear()
        _HOLDS[key] = holds
    return holds


def peak_in_flight_message_bytes(
    layout: Layout, it: IterationPlan, message_bytes: MessageBytes, *, forward_only: bool = False
) -> dict[int, float]:
    """Per plan rank, the most bytes of messages it holds in flight at once (``in_flight_message_bytes``)."""
    held = in_flight_message_bytes(layout, it, message_bytes, forward_only=forward_only)
    return {g: max(v, default=0.0) for g, v in held.items()}


def peak_with_messages(step_bytes: dict[int, list[float]], held: dict[int, list[float]]) -> dict[int, float]:
    """Per rank of ``step_bytes`` (per step of its program, the other bytes it holds while that step
    runs: activations), the most it holds at one step with the messages in flight at that step
    (``in_flight_message_bytes``) added; a rank or step ``held`` lacks holds no message."""
    out = {}
    for g, levels in step_bytes.items():
        msgs = held.get(g, ())
        out[g] = max((b + (msgs[k] if k < len(msgs) else 0.0) for k, b in enumerate(levels)), default=0.0)
    return out
