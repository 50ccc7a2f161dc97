"""Entrain's hierarchical microbatch assignment (paper Algorithm 3): DP split -> stratified encoder
microbatches -> pairwise deferral -> interleaved execution order.

Execution order (pinned): matched pairs run ``ol0, ul0, ol1, ul1, ...`` with the pairs ordered by
their OL microbatch's index ascending (the order of the paper's Fig. 8/9 example: MB3, MB2, MB4,
MB5, MB6, MB1); with odd ``K_eff`` the median microbatch runs last, alone. Each UL microbatch runs
immediately after its OL partner, so a deferred sample's encoder output waits exactly one slot.

``llm_microbatches[i]`` (the LLM microbatch executed with encoder microbatch ``i``) = encoder
microbatch ``i``'s samples minus those it defers, in encoder order, followed by the samples
deferred *to* ``i`` (ascending id). Reported works are exact sums (``math.fsum``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from entrain.core.assignment.deferral import NUM_BUCKETS, deferral_candidates
from entrain.core.assignment.dp_split import check_batch, split_dp
from entrain.core.assignment.matching import bottleneck_match, complete_pairing
from entrain.core.assignment.stratified import (
    coarse_fine_split,
    effective_num_microbatches,
    lpt_assign,
    stratified_assign,
)
from entrain.core.ir.microbatches import Deferral, IterationAssignment, ReplicaAssignment
from entrain.core.workload.work import SampleWork

__all__ = [
    "DeferralPlan",
    "plan_deferral",
    "replica_assignment",
    "assign_replica",
    "assign_entrain",
    "same_count_per_ep_group",
    "refine_llm_balance",
]


@dataclass(frozen=True)
class DeferralPlan:
    """Result of pairwise deferral for one replica's encoder microbatches.

    ``pairs``: ``(ol, ul, deferred ids)`` in execution order; ``t_star``: the bottleneck threshold
    (0 when there is no pair); ``execution_order``: encoder microbatch indices in run order.
    """

    t_star: float
    pairs: tuple[tuple[int, int, tuple[str, ...]], ...]
    median: int | None
    execution_order: tuple[int, ...]


def plan_deferral(
    ids: Sequence[Sequence[str]], llm_work: Sequence[Sequence[float]], num_buckets: int = NUM_BUCKETS
) -> DeferralPlan:
    """Pairwise deferral (paper §5.2) on microbatches given as ids and per-sample LLM work."""
    cand = deferral_candidates(ids, llm_work, num_buckets)
    t_star, match = bottleneck_match(cand.V, cand.L)
    pairs = []
    for row, col, defers in complete_pairing(match, len(cand.ul)):
        moved = cand.deferred(row, col) if defers else ()
        pairs.append((cand.ol[row], cand.ul[col], moved))
    order = [m for ol, ul, _ in pairs for m in (ol, ul)]
    if cand.median is not None:
        order.append(cand.median)
    return DeferralPlan(t_star, tuple(pairs), cand.median, tuple(order))


def replica_assignment(
    encoder_mbs: Sequence[Sequence[SampleWork]], num_buckets: int = NUM_BUCKETS
) -> ReplicaAssignment:
    """Apply pairwise deferral to given encoder microbatches and build the ``ReplicaAssignment``."""
    ids = [[s.id for s in mb] for mb in encoder_mbs]
    plan = plan_deferral(ids, [[s.llm for s in mb] for mb in encoder_mbs], num_buckets)
    llm_of = {s.id: s.llm for mb in encoder_mbs for s in mb}
    llm_mbs = [list(mb) for mb in ids]
    deferrals = []
    for ol, ul, moved in plan.pairs:
        gone = set(moved)
        llm_mbs[ol] = [s for s in llm_mbs[ol] if s not in gone]
        llm_mbs[ul] = llm_mbs[ul] + list(moved)
        deferrals += [Deferral(s, ol, ul) for s in moved]
    return ReplicaAssignment(
        k_eff=len(encoder_mbs),
        encoder_microbatches=tuple(tuple(mb) for mb in ids),
        llm_microbatches=tuple(tuple(mb) for mb in llm_mbs),
        execution_order=plan.execution_order,
        deferrals=tuple(deferrals),
        encoder_work=tuple(math.fsum(s.encoder for s in mb) for mb in encoder_mbs),
        llm_work=tuple(math.fsum(llm_of[s] for s in mb) for mb in llm_mbs),
    )


def assign_replica(
    samples: Sequence[SampleWork], num_microbatches: int, num_buckets: int = NUM_BUCKETS
) -> ReplicaAssignment:
    """Stratified assignment + pairwise deferral for one replica's minibatch."""
    return replica_assignment(stratified_assign(samples, num_microbatches), num_buckets)


def assign_entrain(
    batch: Sequence[SampleWork],
    dp: int,
    num_microbatches: int,
    *,
    num_buckets: int = NUM_BUCKETS,
    **_: object,
) -> IterationAssignment:
    """Entrain's assignment of one global batch: ``dp`` replicas of ``B/dp`` samples, each with
    ``K_eff <= num_microbatches`` encoder microbatches and deferral-balanced LLM microbatches.

    Deterministic: a function of the batch contents (ids and work) only; the input order does not
    matter. Extra keyword arguments (e.g. ``stage_times``, used by other batchers) are ignored.
    """
    check_batch(batch, dp, num_microbatches)
    return IterationAssignment(
        tuple(assign_replica(r, num_microbatches, num_buckets) for r in split_dp(batch, dp))
    )


def same_count_per_ep_group(
    ia: IterationAssignment,
    samples: Mapping[str, SampleWork],
    ep: int,
    num_buckets: int = NUM_BUCKETS,
    predict: Callable[[ReplicaAssignment], float] | None = None,
) -> IterationAssignment:
    """``ia`` with every replica of each expert-parallel group (``ep`` consecutive replicas) on one
    microbatch count, which expert parallelism needs (their all-to-alls pair up): a replica with another
    count is assigned again (stratified + deferral) with exactly that many microbatches.

    The count: without ``predict``, the group's least ``K_eff`` (the paper's rule on each replica's
    samples, capped at its count). With ``predict`` (a replica's predicted makespan), every count from
    that least to the largest a replica of the group allows, and the one whose slowest replica is
    predicted fastest (ties: the smaller count). The group's replicas run in lockstep on the LLM, so one
    replica whose largest encoder sample caps its own rule low (few, coarse microbatches: a long fill
    and drain) would otherwise impose that count on all of them; a replica given more microbatches than
    its rule allows keeps its largest sample alone in one. Then each replica's microbatches are refined
    on the LLM (``refine_llm_balance``). ``ep`` 1: ``ia`` itself."""
    if ep <= 1:
        return ia
    reps = list(ia.replicas)
    for first in range(0, len(reps), ep):
        group = reps[first : first + ep]
        # at most each replica's count and what the paper's rule allows it (another batcher's may exceed)
        allowed = [
            effective_num_microbatches([samples[s].encoder for s in r.sample_ids], r.k_eff) for r in group
        ]
        counts = [min(allowed)] if predict is None else range(min(allowed), max(allowed) + 1)
        best = None
        for k in counts:
            got = [
                rep
                if rep.k_eff == k
                else _assign_exactly([samples[s] for s in sorted(rep.sample_ids)], k, num_buckets)
                for rep in group
            ]
            t = max(map(predict, got)) if predict is not None and len(counts) > 1 else 0.0
            if best is None or t < best[0]:
                best = (t, got)
        # the group's LLM stages run in lockstep: each replica's heavy LLM microbatches cost them all
        reps[first : first + ep] = [refine_llm_balance(r, samples, num_buckets) for r in best[1]]
    return IterationAssignment(tuple(reps))


REFINE_MAX_SWAPS = 32
"""At most this many accepted swaps per replica in ``refine_llm_balance`` (each lowers its LLM microbatches,
largest first; the search usually stops earlier, when no swap does)."""


def refine_llm_balance(
    rep: ReplicaAssignment, samples: Mapping[str, SampleWork], num_buckets: int = NUM_BUCKETS
) -> ReplicaAssignment:
    """``rep`` with samples swapped between its encoder microbatches while that lowers its LLM microbatches
    after deferral (largest first, compared lexicographically: the largest, then the next) and keeps every
    encoder microbatch within the largest one's encoder work (the encoder stage's worst microbatch is no
    worse; each replica keeps its samples and count).

    For the replicas of an expert-parallel group, whose LLM stages run in lockstep: each LLM action
    lasts the longest of the group's at that position, so the group pays every replica's heaviest LLM
    microbatches, which Algorithm 3 (encoder-balanced bins, then deferral within OL/UL pairs) leaves
    uneven. Swaps are tried between a sample of an encoder microbatch (the one holding the heaviest LLM
    microbatch's own samples first) and a lighter-LLM sample of another (first improvement, in load, index
    and id order: deterministic), at most ``REFINE_MAX_SWAPS`` taken."""
    bins = [[samples[s] for s in mb] for mb in rep.encoder_microbatches]
    if len(bins) < 2:
        return rep
    cap = max(math.fsum(s.encoder for s in b) for b in bins)
    cur = replica_assignment(bins, num_buckets)
    for _ in range(REFINE_MAX_SWAPS):
        order = sorted(range(len(cur.llm_work)), key=lambda i: (-cur.llm_work[i], i))
        found = next((f for i in order if (f := _better_swap(bins, i, cap, cur.llm_work, num_buckets))), None)
        if found is None:
            break
        bins, cur = found
    return cur if cur.llm_microbatches != rep.llm_microbatches else rep


def _descending(work) -> list[float]:
    return sorted(work, reverse=True)


def _better_swap(bins, i: int, cap: float, work, num_buckets: int):
    """The first swap between bin ``i`` and another bin within ``cap`` whose LLM microbatches after
    deferral, largest first, are lexicographically below ``work``'s: (bins, assignment), or None."""
    before = _descending(work)
    load = [math.fsum(s.encoder for s in b) for b in bins]
    for j in range(len(bins)):
        if j == i:
            continue
        for a in sorted(bins[i], key=lambda s: s.id):
            for b in sorted(bins[j], key=lambda s: s.id):
                if b.llm >= a.llm:
                    continue  # the heavy bin gives LLM work away
                if load[i] - a.encoder + b.encoder > cap or load[j] - b.encoder + a.encoder > cap:
                    continue
                new = [list(x) for x in bins]
                new[i] = [b if s is a else s for s in new[i]]
                new[j] = [a if s is b else s for s in new[j]]
                got = replica_assignment(new, num_buckets)
                if _lower(_descending(got.llm_work), before):
                    return new, got
    return None


def _assign_exactly(samples: Sequence[SampleWork], k: int, num_buckets: int) -> ReplicaAssignment:
    """Stratified assignment + deferral into exactly ``min(k, len(samples))`` encoder microbatches (the
    paper's rule not applied: ``assign_replica`` where the rule allows ``k``)."""
    coarse, fine = coarse_fine_split(samples)
    return replica_assignment(lpt_assign(coarse + fine, max(1, min(k, len(samples)))), num_buckets)


def _lower(a: list[float], b: list[float]) -> bool:
    """``a`` lexicographically below ``b`` by more than rounding at the first place they differ."""
    for x, y in zip(a, b):
        if x < y * (1.0 - 1e-9):
            return True
        if x > y * (1.0 + 1e-9):
            return False
    return False
