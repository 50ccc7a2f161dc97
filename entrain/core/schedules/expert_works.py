"""Entrain's assignment weighing the busiest expert (``ScheduleOptions.expert_assignment``, a mixture-of-
experts LLM with ``ep`` > 1): each sample's LLM work raised by its predicted busiest-expert time
(``expert_works``), the replicas assigned again on those works (``weighed``) or each expert-parallel
group binned together (``ep_group_bins``), and the plan's microbatch works summed back from the
samples' own (``priced``); with ``rank_shares``, each pipeline rank's share of the work, which the
vector LPT weighs. ``schedules.entrain`` decides when they run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from entrain.core.assignment.hierarchical import replica_assignment
from entrain.core.assignment.stratified import stratified_assign
from entrain.core.assignment.two_resource import RankShares, vector_lpt
from entrain.core.ir.microbatches import IterationAssignment, ReplicaAssignment
from entrain.core.ir.plan import ActionKind
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.workload.work import SampleWork

__all__ = ["EXPERT_SLOPE_STEP", "rank_shares", "expert_works", "ep_group_bins", "weighed", "priced"]


def rank_shares(costs: PlanCosts, ids: Sequence[str]) -> RankShares:
    """Each pipeline rank's share of the encoder's and of the LLM's forward+backward ms over ``ids``."""
    layout = costs.layout
    per_rank = np.zeros((layout.ranks_per_replica, 2))
    for spec in layout.stages:
        col = 0 if spec.component == "encoder" else 1
        per_rank[spec.pp_rank, col] += sum(
            costs.compute_ms(spec.stage, k, ids) for k in (ActionKind.F, ActionKind.B)
        )
    totals = per_rank.sum(axis=0)
    shares = np.divide(per_rank, totals, out=np.zeros_like(per_rank), where=totals > 0)
    return RankShares(tuple(shares[:, 0].tolist()), tuple(shares[:, 1].tolist()))


EXPERT_SLOPE_STEP = 0.05
"""``expert_works``' per-token rate: the busiest-expert ms' central difference over this fraction
either side of the mean microbatch's LLM tokens."""


def expert_works(
    costs: PlanCosts, samples: dict[str, SampleWork], assignments: Sequence[IterationAssignment]
) -> dict[str, SampleWork]:
    """``samples`` with each sample's LLM work raised by its predicted busiest-expert time
    (``ScheduleOptions.expert_assignment``): its LLM tokens times the marginal ms per token of the
    expert time the LLM stages add beyond their balanced curves (the busiest rank's extra expert tokens
    under the router-skew model, and the all-to-all: ``PlanCosts.expert_ms``, forward and backward) at
    the mean LLM microbatch of ``assignments``. That time is a concave function of a microbatch's
    tokens (the busiest expert's excess shrinks as more tokens route), so its slope at the mean prices
    a sample moved between microbatches near it. ``samples`` itself where no stage has experts or the
    rate is 0 (``ep`` 1: one rank runs every expert)."""
    layout = costs.layout
    stages = [s.stage for s in layout.stages if s.component == "llm" and costs.expert_stages[s.stage]]
    reps = [rep for ia in assignments for rep in ia.replicas]
    ids = sorted({s for rep in reps for s in rep.sample_ids})
    count = sum(rep.k_eff for rep in reps)
    if not stages or not ids or count == 0:
        return samples
    tokens = {s: costs.unit_sums("llm", s)[1] for s in ids}
    mean = math.fsum(tokens.values()) / count
    if mean <= 0:
        return samples

    def expert(t: float) -> float:
        return sum(costs.expert_ms(st, phase, t) for st in stages for phase in ("fwd", "bwd"))

    h = EXPERT_SLOPE_STEP
    rate = (expert(mean * (1 + h)) - expert(mean * (1 - h))) / (2 * h * mean)
    if rate <= 0:
        return samples
    out = dict(samples)
    for s in ids:
        w = samples[s]
        out[s] = replace(w, llm=w.llm + rate * tokens[s])
    return out


def ep_group_bins(
    ia: IterationAssignment, works: dict[str, SampleWork], ep: int, costs: PlanCosts
) -> IterationAssignment:
    """``ia`` with each expert-parallel group's samples (``ep`` consecutive replicas, one microbatch count
    ``k``) binned together (``ScheduleOptions.expert_group_bins``): the vector LPT of the two-resource
    assignment (``assignment.two_resource.vector_lpt``: every pipeline rank's load, ``rank_shares``) on
    ``works`` (``expert_works``: LLM work plus the busiest-expert time) into ``ep * k`` microbatches, the
    ``j``-th to replica ``j % ep`` (DFLOP's mapping), then pairwise deferral per replica. The group's
    LLM stages run in lockstep, each action as long as its slowest replica's, so the group's
    microbatches are balanced against each other, not only within each replica (a replica's sample
    count may then differ from the others'). A group where some microbatch would be empty keeps its
    replicas."""
    out = list(ia.replicas)
    for first in range(0, len(out), ep):
        group = out[first : first + ep]
        k = group[0].k_eff
        pool = [works[s] for s in sorted(s for rep in group for s in rep.sample_ids)]
        shares = rank_shares(costs, [w.id for w in pool])
        bins = vector_lpt(pool, len(group) * k, shares)
        if any(not b for b in bins) or any(rep.k_eff != k for rep in group):
            continue
        out[first : first + ep] = [
            replica_assignment([bins[j] for j in range(r, len(bins), len(group))]) for r in range(len(group))
        ]
    return IterationAssignment(tuple(out))


def weighed(
    ia: IterationAssignment, works: dict[str, SampleWork], num_microbatches: int, rule: str
) -> IterationAssignment:
    """``ia`` with every replica's samples assigned again (stratified + deferral, ``rule``'s count) on
    ``works`` (``expert_works``); the DP split kept."""
    return IterationAssignment(
        tuple(
            replica_assignment(
                stratified_assign([works[s] for s in sorted(rep.sample_ids)], num_microbatches, rule)
            )
            for rep in ia.replicas
        )
    )


def priced(rep: ReplicaAssignment, samples: dict[str, SampleWork]) -> ReplicaAssignment:
    """``rep`` with its microbatches' works summed from ``samples`` (the plan records the samples' own)."""
    return replace(
        rep,
        encoder_work=tuple(math.fsum(samples[s].encoder for s in mb) for mb in rep.encoder_microbatches),
        llm_work=tuple(math.fsum(samples[s].llm for s in mb) for mb in rep.llm_microbatches),
    )
