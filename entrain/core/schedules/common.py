"""Building blocks shared by the schedule generators.

* ``ScheduleOptions``: the generators' knobs (eager-forward budget, DIP sub-microbatch caps).
* Microbatch specs from a ``ReplicaAssignment``: one sub per microbatch (1F1B, DistTrain),
  Entrain's non-deferred / deferred encoder subs.
* ``one_f_one_b_order``: the 1F1B pattern over *units* (a forward unit = the forwards of one
  microbatch's subs, a backward slot = the backwards whose gradients the slot's LLM microbatch
  supplies), with a configurable warm-up count.
* ``build_plan``: runs a per-replica compute-order function over every iteration, lowers to
  SEND/RECV (``lowering.add_comms``) and assembles the ``Plan``.
* ``PlanGenerator``: the signature every system's schedule generator has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from entrain.core.assignment.stratified import MICROBATCH_COUNTS
from entrain.core.costs.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.microbatches import IterationAssignment, ReplicaAssignment
from entrain.core.ir.plan import Action, ActionKind, IterationPlan, Layout, MicrobatchSpec, Plan
from entrain.core.schedules.lowering import add_comms
from entrain.core.schedules.pairs import PAIR_ORDER_CANDIDATES
from entrain.core.workload.work import SampleWork

__all__ = [
    "PlanGenerator",
    "ASSIGNMENTS",
    "BACKWARD_ORDERS",
    "PAIR_ORDERS",
    "ScheduleOptions",
    "plain_specs",
    "entrain_specs",
    "one_f_one_b_order",
    "stage_units",
    "build_plan",
    "check_replicas",
    "require_one_stage_per_rank",
    "require_stage_chain",
    "has_fused_rank",
    "rank_units",
    "build_plan_per_replica",
]

ComputeOrder = Callable[[ReplicaGraph], dict[int, list[Action]]]


class PlanGenerator(Protocol):
    """A system's schedule generator (``SystemSpec.generator``): the per-iteration assignments of its
    batcher -> the lowered ``Plan`` on ``layout``. ``system`` is the name the Plan records (one
    generator may serve several systems); ``cost`` None where the generator needs no cost model."""

    def __call__(
        self,
        layout: Layout,
        assignments: Sequence[IterationAssignment],
        samples: dict[str, SampleWork],
        cost: CostModel | None = None,
        options: ScheduleOptions | None = None,
        *,
        system: str,
    ) -> Plan: ...


ASSIGNMENTS = ("paper", "two-resource", "auto")
"""Entrain's per-iteration assignment choices (``ScheduleOptions.assignment``)."""

BACKWARD_ORDERS = ("slot", "per-b")
"""Orders of a split backward's ``I``s and ``W``s (``ScheduleOptions.backward_order``)."""

PAIR_ORDERS = ("paper", *PAIR_ORDER_CANDIDATES, "auto")
"""Orders of Entrain's deferral pairs in a replica's iteration (``ScheduleOptions.pair_order``)."""


@dataclass(frozen=True, slots=True)
class ScheduleOptions:
    """Generator options. Units: bytes factor (dimensionless), ViT patches, LLM tokens."""

    eager_budget_factor: float = 1.25
    """Entrain's eager-forward budget per rank = factor x (peak activation bytes of its plain 1F1B
    schedule: the warm-up plus the deferred sub-microbatches it must hold)."""
    dip_encoder_cap_patches: float | None = None
    """DIP: at most this many ViT patches per encoder sub-microbatch (None: 2x the profile's mean)."""
    dip_llm_cap_tokens: float | None = None
    """DIP: at most this many LLM tokens per LLM sub-microbatch (None: 2x the profile's mean)."""
    dip_memory_budget_bytes: float | None = None
    """``dip-greedy-mem``: per-rank memory (model state + held activations) its in-flight window keeps
    within (None: the device memory)."""
    dip_profile_samples: int = 4
    """DIP's profile (one microbatch): the first this-many samples of the first iteration."""
    ramp_microbatches: int | str = 0
    """Entrain extension (not in the paper; 0 = off, the paper's schedule): cut the first and the last
    this-many microbatches (encoder non-deferred part and LLM microbatch) into ``ramp_pieces``
    work-balanced sub-microbatches, so the pipeline fills and drains at a finer grain. ``"auto"``:
    per replica, generate the plain order and the orders ramped over ``p - 1`` microbatches (``p`` =
    pipeline ranks) in 2 .. min(microbatch size, 8) pieces, and keep the one with the lowest
    predicted makespan (``predict.predicted_makespan_ms``; ties: the earlier candidate, no ramp
    first)."""
    ramp_pieces: int = 2
    split_weight_grads: bool = False
    """Entrain extension (not in the paper; off = the paper's schedule): every backward runs as ``I``
    (input gradients, sent upstream at once) then ``W`` (weight gradients) in the same place of the
    order, so the previous stage gets its gradient after the input half of the backward (the
    zero-bubble split; the runtime runs ``I + W`` as one backward's work)."""
    backward_order: str = "slot"
    """Under ``split_weight_grads``, the order of the ``I``s and ``W``s of a backward slot that holds
    several stages (a fused rank of the boundary-sharing layout: the LLM's backward, then the encoder
    backwards it completes; ``BACKWARD_ORDERS``): ``"slot"`` runs the slot's ``I``s, then its ``W``s
    (the encoder's gradient leaves before the LLM's ``W``), ``"per-b"`` each ``B`` as ``I, W`` in place
    (the LLM's activations are freed before the encoder's backward). Identical on every other rank.
    ``entrain.core.planning.setups`` decides it by simulation (the ``backward_order`` decision): the cost
    model's prediction cannot, it never ranks ``"per-b"`` ahead (per-b can only win through memory)."""

    assignment: str = "paper"
    """Entrain's per-iteration assignment (``ASSIGNMENTS``): ``"paper"`` (Algorithm 3: stratified on
    encoder work, then pairwise deferral), ``"two-resource"`` (our extension: vector LPT on the
    per-rank encoder and LLM loads, then deferral, ``assignment.two_resource``) or ``"auto"``: per
    replica and iteration, whichever has the lower predicted makespan (with the ramp candidates;
    ties: the paper's), recorded in ``Plan.options["assignment_chosen"][iteration][replica]``. Under
    both of the latter the DP split is chosen per iteration too: the paper's or the two-resource one
    (``assignment.two_resource.split_dp_two_resource``), whichever leaves the smaller largest per-rank
    replica load, recorded in ``Plan.options["dp_split_chosen"][iteration]``."""

    microbatch_count: str = "paper"
    """Entrain's encoder microbatches per replica (``assignment.stratified.MICROBATCH_COUNTS``):
    ``"paper"``: ``K_eff`` (Algorithm 3's rule, at most the requested count); ``"requested"``: the
    requested count (global batch / (dp x microbatch size)), for both assignments; ``"double"``: twice
    the requested count (microbatches of about half the requested size; ours). Decided by
    simulation first among the schedule options (the ``microbatch count`` decision,
    ``entrain.core.planning.extensions``: the later ones are made at the count the plan runs), and the
    simulated memory check tries it again where the plan recomputes and ``K_eff`` fell below it
    (smaller microbatches hold fewer activations, so they may need less recomputation;
    ``sim.memory_fit``)."""

    pair_order: str = "paper"
    """Entrain's order of its deferral pairs (``PAIR_ORDERS``): ``"paper"``, Algorithm 3's (by the OL
    microbatch's index); ours: ``"light first"`` / ``"heavy first"``, the pairs by their predicted time
    over every stage ascending (a short fill) or descending (a short drain), each pair still OL then
    UL and an odd ``K_eff``'s median still last (``pairs.ordered_pairs``); ``"auto"``, per replica and
    iteration, whichever of the three has the lowest predicted makespan (``predict.predicted_makespan_ms``,
    with the replica's chosen assignment and ramp; ties: the paper's), recorded in
    ``Plan.options["pair_order_chosen"][iteration][replica]``.
    The ``pair_order`` decision (``entrain.core.planning.extensions``). Gradients are unchanged: the
    loss is normalised by the global label count."""

    dp_resplit: bool = True
    """Under ``assignment`` ``"two-resource"`` or ``"auto"``: whether the DP split may be re-chosen per
    iteration (the paper's or the two-resource one, ``entrain.balanced_dp_split``); False keeps the
    paper's DP split (``entrain.core.planning.setups`` decides it by simulation, the ``dp_split`` decision)."""

    memory_split: bool = True
    """Entrain (ours, not the paper's): cut an encoder (sub-)microbatch whose recomputing backward
    would overflow its rank into sub-microbatches that fit (``schedules.memory_split``); only where
    needed, the cuts recorded in ``Plan.options["memory_split"]``."""
    memory_budget_bytes: float | None = None
    """Per-rank memory (model state + held activations + recomputation transient) Entrain's memory
    split keeps within (None: the device memory)."""
    encoder_rebalance: bool = False
    """Entrain (after the 2026 systems): rebalance each position's encoder work across the DP
    replicas by all-to-all, the features returned to their owners (``schedules.rebalance``; the
    ``encoder_rebalance`` decision, ``entrain.core.planning.setups``)."""
    expert_balance: bool = False
    """Entrain with expert parallelism (``ep > 1``; ours): each replica of an EP group runs its
    deferral pairs (OL then UL, back to back) by their predicted LLM time, expert work included,
    heaviest first (an odd median still last), so a position's heavy microbatches meet across the
    group, whose sparse layers wait for the group's slowest (``schedules.entrain``; the
    ``expert_balance`` decision, ``entrain.core.planning.extensions``). No effect at ``ep`` 1."""
    expert_assignment: bool = False
    """Entrain with expert parallelism (``ep > 1``; ours): the assignment balances each microbatch's
    predicted busiest-expert time as a third resource beside encoder and LLM work. Wherever Entrain's
    assignment weighs a sample's LLM work (Algorithm 3's bins and deferral, the two-resource assignment,
    the DP re-split, the EP group's shared count and LLM refinement) it weighs that work plus the
    sample's LLM tokens times the marginal ms per token of the LLM stages' busiest-rank expert tokens
    and all-to-all (``CostModel.expert_ms``: the router-skew model) at the mean microbatch
    (``schedules.expert_works.expert_works``); the plan records the samples' own works. The
    ``expert_assignment`` decision (``entrain.core.planning.extensions``). No effect at ``ep`` 1."""
    expert_group_bins: bool = False
    """With ``expert_assignment`` (ours): each EP group's samples are binned together, the group's
    ``ep * k`` microbatches balanced against each other by the two-resource vector LPT on the weighed
    works (``schedules.expert_works.ep_group_bins``: the group's LLM stages run in lockstep), so a
    replica's sample count may differ from the others'. The ``expert_assignment`` decision's third
    candidate. No effect without ``expert_assignment`` or at ``ep`` 1."""

    def __post_init__(self) -> None:
        if self.assignment not in ASSIGNMENTS:
            raise ConfigError(f"assignment must be one of {', '.join(ASSIGNMENTS)}, got {self.assignment!r}")
        if self.microbatch_count not in MICROBATCH_COUNTS:
            raise ConfigError(
                f"microbatch_count must be one of {', '.join(MICROBATCH_COUNTS)}, got {self.microbatch_count!r}"
            )
        if self.pair_order not in PAIR_ORDERS:
            raise ConfigError(f"pair_order must be one of {', '.join(PAIR_ORDERS)}, got {self.pair_order!r}")
        if self.backward_order not in BACKWARD_ORDERS:
            raise ConfigError(
                f"backward_order must be one of {', '.join(BACKWARD_ORDERS)}, got {self.backward_order!r}"
            )
        r = self.ramp_microbatches
        if not (r == "auto" or (isinstance(r, int) and not isinstance(r, bool) and r >= 0)):
            raise ConfigError(f"ramp_microbatches must be a count >= 0 or 'auto', got {r!r}")
        if self.ramp_pieces < 2:
            raise ConfigError(f"ramp_pieces must be >= 2, got {self.ramp_pieces}")

    @classmethod
    def from_any(cls, options: ScheduleOptions | dict | None) -> ScheduleOptions:
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        known = set(cls.__dataclass_fields__)
        unknown = set(options) - known
        if unknown:
            raise ConfigError(f"unknown schedule option(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**options)

    def to_json(self) -> dict:
        return asdict(self)


# --- microbatch specs ------------------------------------------------------------------------------
def plain_specs(rep: ReplicaAssignment) -> tuple[MicrobatchSpec, ...]:
    """One sub per microbatch, in execution order."""
    return tuple(
        MicrobatchSpec(pos, i, (rep.encoder_microbatches[i],), (rep.llm_microbatches[i],))
        for pos, i in enumerate(rep.execution_order)
    )


def entrain_specs(
    rep: ReplicaAssignment, samples: dict[str, SampleWork] | None = None, ramp: int = 0, pieces: int = 2
) -> tuple[MicrobatchSpec, ...]:
    """Entrain: an encoder microbatch with deferrals runs as sub 0 (non-deferred samples) and
    sub 1 (deferred samples, consumed by the next LLM microbatch); LLM microbatches whole.

    With ``ramp > 0`` (an extension, see ``ScheduleOptions.ramp_microbatches``) the first and last
    ``ramp`` microbatches cut their non-deferred encoder part and their LLM microbatch into
    ``pieces`` work-balanced subs (the deferred encoder sub, if any, stays last)."""
    out = []
    k = len(rep.execution_order)
    for pos, i in enumerate(rep.execution_order):
        ids = rep.encoder_microbatches[i]
        deferred = set(rep.deferred_from(i))
        kept = tuple(s for s in ids if s not in deferred)
        moved = tuple(s for s in ids if s in deferred)
        llm_subs: tuple[tuple[str, ...], ...] = (rep.llm_microbatches[i],)
        enc_kept: tuple[tuple[str, ...], ...] = (kept,) if kept else ()
        if samples is not None and ramp > 0 and (pos < ramp or pos >= k - ramp):
            enc_kept = balanced_pieces(kept, [samples[s].encoder for s in kept], pieces)
            llm_subs = balanced_pieces(llm_subs[0], [samples[s].llm for s in llm_subs[0]], pieces)
        subs = enc_kept + ((moved,) if moved else ()) or ((),)
        out.append(MicrobatchSpec(pos, i, subs, llm_subs))
    return tuple(out)


def balanced_pieces(ids: Sequence[str], work: Sequence[float], pieces: int) -> tuple[tuple[str, ...], ...]:
    """Cut ``ids`` in order into at most ``pieces`` non-empty runs of about equal ``work``."""
    if len(ids) < 2 or pieces < 2:
        return (tuple(ids),) if ids else ()
    total = float(sum(work))
    out: list[list[str]] = [[]]
    acc = 0.0
    for sid, w in zip(ids, work):
        target = total * len(out) / pieces
        if out[-1] and len(out) < pieces and abs(acc + w - target) > abs(acc - target):
            out.append([])
        out[-1].append(sid)
        acc += w
    return tuple(tuple(g) for g in out)


# --- 1F1B over units -------------------------------------------------------------------------------
def _sub(graph: ReplicaGraph, stage: int, mb: int, sub: int) -> int | None:
    return None if graph.num_subs(stage, mb) == 1 else sub


def stage_units(graph: ReplicaGraph, stage: int) -> tuple[list[list[Action]], list[list[Action]]]:
    """(forward units, backward slots) of one stage, both indexed by microbatch position.

    A backward slot k holds the backwards of the tasks whose gradients LLM microbatch k supplies
    (``ReplicaGraph.grad_slot``): Entrain's split backward runs a deferred encoder sub in the slot
    of the LLM microbatch that consumed it."""
    k = len(graph.microbatches)
    fwd: list[list[Action]] = [[] for _ in range(k)]
    bwd: list[list[Action]] = [[] for _ in range(k)]
    for _, m, u in graph.tasks(stage):
        s = _sub(graph, stage, m, u)
        fwd[m].append(Action(stage, ActionKind.F, m, s))
        slot = graph.grad_slot(m, u) if graph.is_encoder(stage) else m
        bwd[slot].append(Action(stage, ActionKind.B, m, s))
    return fwd, bwd


def has_fused_rank(layout: Layout) -> bool:
    """Whether a pipeline rank holds several stages (the boundary-sharing layout)."""
    return len(layout.stages) > layout.ranks_per_replica


def rank_units(graph: ReplicaGraph, rank: int) -> tuple[list[list[Action]], list[list[Action]]]:
    """(forward units, backward slots) of a pipeline rank holding consecutive stages (a chain):
    forward unit k runs the rank's stages in stage order, backward slot k in reverse order, so a
    rank holding the last encoder stage and the first LLM stage feeds its LLM forward locally and
    runs an encoder backward right after the LLM backwards that supply its gradients."""
    stages = [s.stage for s in graph.layout.stages_of(rank)]
    k = len(graph.microbatches)
    fwd: list[list[Action]] = [[] for _ in range(k)]
    bwd: list[list[Action]] = [[] for _ in range(k)]
    per_stage = [stage_units(graph, s) for s in stages]
    for m in range(k):
        for f, _ in per_stage:
            fwd[m] += f[m]
        for _, b in reversed(per_stage):
            bwd[m] += b[m]
    return fwd, bwd


def one_f_one_b_order(fwd: Sequence[list[Action]], bwd: Sequence[list[Action]], warmup: int) -> list[Action]:
    """Warm-up forwards, then (forward unit, backward slot) pairs, then the remaining slots."""
    n = len(fwd)
    w = max(0, min(warmup, n))
    out = [a for unit in fwd[:w] for a in unit]
    for i in range(n - w):
        out += fwd[w + i]
        out += bwd[i]
    for i in range(n - w, n):
        out += bwd[i]
    return out


def require_one_stage_per_rank(layout: Layout, system: str) -> None:
    per_rank = [len(layout.stages_of(r)) for r in range(layout.ranks_per_replica)]
    if any(n != 1 for n in per_rank):
        raise ConfigError(
            f"{system} needs one stage per pipeline rank; the layout has {per_rank} stages per rank"
        )


def require_stage_chain(layout: Layout, system: str) -> None:
    """Stages must form one chain over the pipeline ranks: stage 0 on rank 0 and each next stage on
    the same rank or the next one (several consecutive stages per rank allowed: boundary sharing)."""
    ranks = [s.pp_rank for s in layout.stages]
    ok = ranks[0] == 0 and all(b - a in (0, 1) for a, b in zip(ranks, ranks[1:]))
    if not ok:
        raise ConfigError(
            f"{system} needs consecutive stages on consecutive pipeline ranks; the layout places stages on {ranks}"
        )


# --- plan assembly ---------------------------------------------------------------------------------
def build_plan(
    system: str,
    layout: Layout,
    assignments: Sequence[IterationAssignment],
    samples: dict[str, SampleWork],
    specs: Callable[[ReplicaAssignment], tuple[MicrobatchSpec, ...]],
    order: ComputeOrder,
    options: dict,
) -> Plan:
    """Assemble a Plan: per iteration and replica, microbatch specs, compute order, lowering."""

    def replica(rep: ReplicaAssignment) -> tuple[tuple[MicrobatchSpec, ...], dict[int, list[Action]]]:
        mbs = specs(rep)
        return mbs, order(ReplicaGraph(layout, mbs))

    return build_plan_per_replica(system, layout, assignments, samples, replica, options)


def check_replicas(layout: Layout, assignments: Sequence[IterationAssignment]) -> None:
    """Every iteration's assignment has ``layout.dp`` replicas."""
    for ia in assignments:
        if len(ia.replicas) != layout.dp:
            raise ConfigError(f"assignment has {len(ia.replicas)} replicas but the layout has dp={layout.dp}")


def build_plan_per_replica(
    system: str,
    layout: Layout,
    assignments: Sequence[IterationAssignment],
    samples: dict[str, SampleWork],
    replica: Callable[[ReplicaAssignment], tuple],
    options: dict,
    lowered: bool = False,
) -> Plan:
    """``build_plan`` with one function returning a replica's (microbatch specs, compute order), or
    (specs, compute order, the ``ReplicaAssignment`` actually used) when it may replace the given one
    (Entrain's assignment choice); the Plan records the assignments used. ``lowered``: the orders
    come with their SEND/RECV already (``lowering.add_comms``)."""
    check_replicas(layout, assignments)
    iterations = []
    for ia in assignments:
        all_specs, actions, used_reps = [], {}, []
        for r, rep in enumerate(ia.replicas):
            mbs, compute, *used = replica(rep)
            used_reps.append(used[0] if used else rep)
            acts_per_rank = compute if lowered else add_comms(ReplicaGraph(layout, mbs), compute)
            for pp, acts in acts_per_rank.items():
                actions[layout.global_rank(r, pp)] = tuple(acts)
            all_specs.append(mbs)
        iterations.append(IterationPlan(IterationAssignment(tuple(used_reps)), tuple(all_specs), actions))
    used = {s for it in iterations for rep in it.assignment.replicas for s in rep.sample_ids}
    missing = sorted(used - set(samples))
    if missing:
        raise ConfigError(f"{len(missing)} assigned sample(s) have no work, e.g. {missing[0]!r}")
    return Plan(system, layout, tuple(iterations), {s: samples[s] for s in sorted(used)}, dict(options))
