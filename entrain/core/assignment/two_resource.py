"""Two-resource assignment (our extension, not the paper's): encoder microbatches that balance the
encoder *and* the LLM at once, then the paper's pairwise deferral.

The paper stratifies on encoder work only (``stratified``), which is right when the encoder is the
bottleneck. When the LLM is (long answers, text-only samples, long documents with small images),
LLM-heavy samples with little encoder work pile up in whichever microbatches the encoder LPT left
light, and pairwise deferral can move at most one subset between two microbatches.

Model: a microbatch's time on pipeline rank ``r`` is ``a_r * E + b_r * L`` (``E``/``L``: its encoder
and LLM work; ``a_r``/``b_r``: rank ``r``'s shares of the encoder's and the LLM's work, from the
layout, ``RankShares``). The pipeline's pace is set by the slowest rank, so a microbatch's *size*
is ``max_r (a_r * E + b_r * L)``.

Pinned:

* ``K`` = the paper's ``K_eff`` rule (``floor(total / largest)``, capped at ``num_microbatches``)
  applied to the bottleneck rank (the rank with the most work) or to the encoder, whichever allows
  more microbatches: never fewer than the paper's assignment uses.
* Vector LPT: samples sorted by (size descending, summed per-rank work descending, id ascending);
  each goes to the microbatch whose resulting size is least; ties: the least resulting summed load,
  then fewer samples, then the lowest index. Bound (checked in tests): the largest microbatch size
  is at most (all samples' summed per-rank work) / K + the largest sample's size.
* Then pairwise deferral (``hierarchical.replica_assignment``) moves LLM work between OL/UL pairs.
* The result is whichever of that and the paper's assignment (stratified + deferral) has the
  smaller largest microbatch size after deferral (ties: the smaller sum of squared sizes, then the
  vector LPT). So on the two-resource objective it is never worse than the paper's; where the LLM
  dominates every sample (``EQUAL_SHARES``), its largest LLM microbatch is never larger.
* DP split (``split_dp_two_resource``): the paper gives each replica ``B / dp`` samples in encoder
  order, each to the replica with the least LLM load (``dp_split``), so on LLM-dominant data the
  long texts that come last land wherever the sample count leaves room. Here samples go by size
  (the largest per-rank work) descending in rounds of ``dp``, one per replica a round, each to the
  open replica whose largest per-rank load grows least. Entrain's generator keeps it per iteration
  where its largest replica load (``replica_loads``) is below the paper split's
  (``schedules.entrain.balanced_dp_split``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from entrain.core.assignment.deferral import NUM_BUCKETS
from entrain.core.assignment.dp_split import check_batch
from entrain.core.assignment.hierarchical import replica_assignment
from entrain.core.assignment.stratified import effective_num_microbatches, microbatch_count, stratified_assign
from entrain.core.ir.microbatches import ReplicaAssignment
from entrain.core.workload.work import SampleWork

__all__ = [
    "RankShares",
    "EQUAL_SHARES",
    "two_resource_k",
    "vector_lpt",
    "microbatch_sizes",
    "assign_replica_two_resource",
    "split_dp_two_resource",
    "replica_loads",
]


@dataclass(frozen=True, slots=True)
class RankShares:
    """Per pipeline rank: the share of encoder work (``encoder[r]``) and of LLM work (``llm[r]``)."""

    encoder: tuple[float, ...]
    llm: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.encoder) != len(self.llm) or not self.encoder:
            raise ValueError(f"rank shares need one (encoder, llm) pair per rank, got {self}")

    def matrix(self) -> np.ndarray:
        """``(ranks, 2)``: row ``r`` = ``(a_r, b_r)``."""
        return np.array([self.encoder, self.llm], dtype=float).T


EQUAL_SHARES = RankShares((1.0, 0.0), (0.0, 1.0))
"""No layout known: one encoder rank and one LLM rank, i.e. the size is ``max(E, L)``."""


def _rank_work(samples: Sequence[SampleWork], shares: RankShares) -> np.ndarray:
    """``(n, ranks)``: each sample's work on each rank."""
    work = np.array([(s.encoder, s.llm) for s in samples], dtype=float).reshape(-1, 2)
    return work @ shares.matrix().T


def two_resource_k(
    samples: Sequence[SampleWork], num_microbatches: int, shares: RankShares, rule: str = "paper"
) -> int:
    """Microbatches for one replica: the paper's ``K_eff`` rule on the bottleneck rank or on the
    encoder, whichever is larger; ``rule`` ``"requested"``: the requested count
    (``stratified.microbatch_count``)."""
    if rule != "paper":
        return microbatch_count([s.encoder for s in samples], num_microbatches, rule)
    n = len(samples)
    per_rank = _rank_work(samples, shares)
    totals = per_rank.sum(axis=0)
    r = int(np.argmax(totals)) if n else 0
    paper = effective_num_microbatches([s.encoder for s in samples], num_microbatches)
    largest = float(per_rank[:, r].max(initial=0.0))
    if largest <= 0.0:
        return max(paper, min(num_microbatches, n))
    return max(paper, min(num_microbatches, math.floor(totals[r] / largest * (1.0 + 1e-9))))


def microbatch_sizes(assignment: ReplicaAssignment, shares: RankShares) -> np.ndarray:
    """Per slot ``i`` (encoder microbatch ``i`` with LLM microbatch ``i``): ``max_r a_r E_i + b_r L_i``."""
    work = np.array([assignment.encoder_work, assignment.llm_work], dtype=float).T.reshape(-1, 2)
    return (work @ shares.matrix().T).max(axis=1, initial=0.0)


def vector_lpt(samples: Sequence[SampleWork], num_bins: int, shares: RankShares) -> list[list[SampleWork]]:
    """Greedy min-max list scheduling of ``samples`` on per-rank loads (see module docstring)."""
    per_rank = _rank_work(samples, shares)
    size = per_rank.max(axis=1, initial=0.0)
    spread = per_rank.sum(axis=1)
    order = sorted(range(len(samples)), key=lambda i: (-size[i], -spread[i], samples[i].id))
    loads = np.zeros((num_bins, per_rank.shape[1]))
    counts = np.zeros(num_bins)
    bins: list[list[SampleWork]] = [[] for _ in range(num_bins)]
    index = np.arange(num_bins)
    for i in order:
        after = loads + per_rank[i]
        key = np.lexsort((index, counts, after.sum(axis=1), after.max(axis=1)))
        b = int(key[0])
        loads[b] = after[b]
        counts[b] += 1
        bins[b].append(samples[i])
    return bins


def assign_replica_two_resource(
    samples: Sequence[SampleWork],
    num_microbatches: int,
    shares: RankShares = EQUAL_SHARES,
    num_buckets: int = NUM_BUCKETS,
    paper: ReplicaAssignment | None = None,
    rule: str = "paper",
) -> ReplicaAssignment:
    """Vector-LPT encoder microbatches + pairwise deferral for one replica's minibatch, or the
    paper's assignment (``paper`` when already computed) where that is better (module docstring);
    ``rule``: the microbatch count's (``two_resource_k``)."""
    k = two_resource_k(samples, num_microbatches, shares, rule)
    vector = replica_assignment(vector_lpt(samples, k, shares), num_buckets)
    if paper is None:
        paper = replica_assignment(stratified_assign(samples, num_microbatches, rule), num_buckets)

    def objective(a: ReplicaAssignment) -> tuple[float, float]:
        sizes = microbatch_sizes(a, shares)
        return float(sizes.max(initial=0.0)), float(np.square(sizes).sum())

    return paper if objective(paper) < objective(vector) else vector


def replica_loads(replicas: Sequence[Sequence[SampleWork]], shares: RankShares) -> np.ndarray:
    """``(dp, ranks)``: each replica's summed work on each pipeline rank."""
    return np.array([_rank_work(r, shares).sum(axis=0) for r in replicas]).reshape(len(replicas), -1)


def split_dp_two_resource(batch: Sequence[SampleWork], dp: int, shares: RankShares) -> list[list[SampleWork]]:
    """``dp`` minibatches of exactly ``B / dp`` samples balancing every pipeline rank's load: samples
    by size descending (then summed per-rank work descending, id ascending) in rounds of ``dp``, one
    sample per replica a round; within a round each sample goes to the replica not yet served whose
    resulting largest per-rank load is least (ties: the least resulting summed load, then the lowest
    index). Each minibatch lists its samples in the order they were assigned."""
    check_batch(batch, dp)
    per_rank = _rank_work(batch, shares)
    size = per_rank.max(axis=1, initial=0.0)
    order = sorted(range(len(batch)), key=lambda i: (-size[i], -per_rank[i].sum(), batch[i].id))
    loads = np.zeros((dp, per_rank.shape[1]))
    replicas: list[list[SampleWork]] = [[] for _ in range(dp)]
    index = np.arange(dp)
    for start in range(0, len(order), dp):
        served = np.zeros(dp, dtype=bool)
        for i in order[start : start + dp]:
            after = loads + per_rank[i]
            worst = np.where(served, np.inf, after.max(axis=1))
            b = int(np.lexsort((index, after.sum(axis=1), worst))[0])
            loads[b], served[b] = after[b], True
            replicas[b].append(batch[i])
    return replicas
