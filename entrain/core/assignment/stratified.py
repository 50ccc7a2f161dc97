"""Stratified sample assignment (paper §5.1, Algorithm 3 lines 3-6): encoder microbatches.

Pinned (docs/design.md §1.2):

* ``K_eff = min(K, floor(sum(w_enc) / max(w_enc)))``, at least 1. The floor is taken with a
  relative tolerance of 1e-9 so that ``3 * (1/3) / (1/3)`` counts as 3. A replica whose encoder
  work is all zero (text-only) gets ``K_eff = min(K, n)``.
* Coarse set = samples whose LLM work is strictly above the replica's median LLM work; fine set =
  the rest. Each set is sorted on (encoder work descending, id ascending).
* LPT list scheduling, coarse set first then fine set: each sample goes to the microbatch with the
  least encoder work; exact ties go to the microbatch with fewer samples, then the lowest index
  (the sample-count step only matters for zero-work samples and guarantees no empty microbatch
  whenever ``n >= K_eff``).

Guarantee (Graham's list-scheduling bound, valid for any list order): the largest encoder load is
at most ``sum/K_eff + (1 - 1/K_eff) * max_sample <= (2 - 1/K_eff) * max(sum/K_eff, max_sample)``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np

from entrain.core.assignment.dp_split import sort_desc
from entrain.core.workload.work import SampleWork

__all__ = [
    "MICROBATCH_COUNTS",
    "effective_num_microbatches",
    "microbatch_count",
    "coarse_fine_split",
    "lpt_assign",
    "stratified_assign",
]

_FLOOR_RTOL = 1e-9

_PER_REQUESTED = {"requested": 1, "double": 2}
"""Microbatches per requested one, for the rules other than the paper's."""
MICROBATCH_COUNTS = ("paper", *_PER_REQUESTED)
"""How many encoder microbatches a replica gets (``microbatch_count``; ``ScheduleOptions.microbatch_count``)."""


def effective_num_microbatches(encoder_work: Sequence[float], num_microbatches: int) -> int:
    """``K_eff`` for one replica (see module docstring). ``num_microbatches`` is the user's ``K``."""
    n = len(encoder_work)
    w_max = max(encoder_work, default=0.0)
    if w_max <= 0.0:
        return max(1, min(num_microbatches, n))
    ratio = math.fsum(encoder_work) / w_max
    return max(1, min(num_microbatches, math.floor(ratio * (1.0 + _FLOOR_RTOL))))


def microbatch_count(encoder_work: Sequence[float], num_microbatches: int, rule: str = "paper") -> int:
    """A replica's encoder microbatch count: ``"paper"``: ``K_eff`` (``effective_num_microbatches``);
    ``"requested"``: the run's ``K`` (global batch / (dp x microbatch size)), at most one per sample;
    ``"double"``: ``2 K``, at most one per sample (microbatches of about half the requested size: the same
    samples and gradients, fewer activations held per microbatch, a finer pipeline fill and drain, more
    per-call constants; Entrain's ``microbatch count`` decision weighs them by simulation).
    ``K_eff`` keeps the largest sample from bounding a microbatch, but where one sample dwarfs the rest
    (a long video in a mixture) it leaves a few microbatches of many samples each, whose activations
    can need recomputation on every rank; ``K`` microbatches of the requested size may then fit with
    little or none (the memory check tries both for Entrain, ``sim.memory_fit``)."""
    if rule not in MICROBATCH_COUNTS:
        raise ValueError(f"microbatch count rule {rule!r}; choose from {', '.join(MICROBATCH_COUNTS)}")
    if rule in _PER_REQUESTED:
        return max(1, min(num_microbatches * _PER_REQUESTED[rule], len(encoder_work)))
    return effective_num_microbatches(encoder_work, num_microbatches)


def coarse_fine_split(samples: Sequence[SampleWork]) -> tuple[list[SampleWork], list[SampleWork]]:
    """(coarse, fine): coarse = LLM work strictly above the median; each sorted encoder-descending."""
    if not samples:
        return [], []
    median = float(np.median([s.llm for s in samples]))
    coarse = [s for s in samples if s.llm > median]
    fine = [s for s in samples if not s.llm > median]
    return sort_desc(coarse, "encoder"), sort_desc(fine, "encoder")


def lpt_assign(samples: Sequence[SampleWork], num_bins: int) -> list[list[SampleWork]]:
    """Greedy list scheduling of ``samples`` in the given order into ``num_bins`` bins by encoder work.

    Each sample goes to the bin with (least encoder load, fewest samples, lowest index).
    """
    bins: list[list[SampleWork]] = [[] for _ in range(num_bins)]
    heap = [(0.0, 0, i) for i in range(num_bins)]  # (load, count, index): heap order = tie-break order
    for s in samples:
        load, count, i = heapq.heappop(heap)
        bins[i].append(s)
        heapq.heappush(heap, (load + s.encoder, count + 1, i))
    return bins


def stratified_assign(
    samples: Sequence[SampleWork], num_microbatches: int, rule: str = "paper"
) -> list[list[SampleWork]]:
    """One replica's encoder microbatches: ``microbatch_count`` bins (``K_eff`` by default) from
    coarse-then-fine LPT."""
    k_eff = microbatch_count([s.encoder for s in samples], num_microbatches, rule)
    coarse, fine = coarse_fine_split(samples)
    return lpt_assign(coarse + fine, k_eff)
