"""Pairwise deferral candidates (paper §5.2 step 1-2, Algorithm 3 lines 7-12): subset-sum DP, ``V``, ``L``.

Pinned (DESIGN.md §1):

* Microbatches are ranked by LLM work (descending, ties to the lower index); the top
  ``floor(K/2)`` are overloaded (OL), the bottom ``floor(K/2)`` underloaded (UL); with odd ``K``
  the median one is neither (it runs last, alone). Rows of ``V`` / ``L`` list the OL microbatches
  and columns the UL microbatches, each in ascending microbatch index.
* One subset-sum table per OL microbatch ``i`` (independent of the partner ``j``): sample LLM
  work is discretised into buckets of ``w_i / 256`` (rounded to nearest; a sample with non-zero
  work counts at least 1 bucket). For every reachable bucket sum the table keeps one
  representative subset: fewest samples, then the smallest ids (lexicographically smallest
  sorted id tuple).
* For a partner ``j`` with target ``delta = (w_i - w_j) / 2``, the chosen subset is the
  representative whose **exact** LLM sum ``d`` is closest to ``delta``; ties prefer fewer samples,
  then the smallest ids; a representative with ``d > w_i - w_j`` is discarded (the empty subset,
  ``d = 0``, always qualifies). ``V[i, j] = max(w_i - d, w_j + d)`` and ``L[i] = w_i`` use exact
  sums, so ``V[i, j] <= L[i]`` always: deferral never raises the larger of the two loads.

Cost: ``O(n_i * 256)`` per OL table plus ``O(num_UL * 256)`` per OL row for the queries, i.e.
``O(K^2 * 256)`` per replica at worst.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "NUM_BUCKETS",
    "SubsetTable",
    "DeferralCandidates",
    "split_overloaded",
    "subset_table",
    "choose_deferrals",
    "deferral_candidates",
]

NUM_BUCKETS = 256
_UNREACHABLE = np.iinfo(np.int64).max // 4


@dataclass(frozen=True)
class SubsetTable:
    """Representative subsets of one OL microbatch's samples (samples in ascending id order).

    Row ``r`` is one reachable bucket sum: ``members[r]`` (bool per sample), ``exact[r]`` its exact
    LLM sum, ``count[r]`` its number of samples. Row 0 is the empty subset.
    """

    members: np.ndarray
    exact: np.ndarray
    count: np.ndarray


@dataclass(frozen=True)
class DeferralCandidates:
    """``V`` (num_OL x num_UL), ``L`` (num_OL) and, per OL row, what ``deferred(row, col)`` needs."""

    ol: tuple[int, ...]
    ul: tuple[int, ...]
    median: int | None
    V: np.ndarray
    L: np.ndarray
    sorted_ids: tuple[tuple[str, ...], ...]
    tables: tuple[SubsetTable, ...]
    choices: np.ndarray
    """``choices[row, col]``: the chosen row of ``tables[row]`` for that partner."""

    def deferred(self, row: int, col: int) -> tuple[str, ...]:
        """Ids (ascending) that OL row ``row`` defers when paired with UL column ``col``."""
        members = self.tables[row].members[self.choices[row, col]]
        return tuple(s for s, m in zip(self.sorted_ids[row], members) if m)


def split_overloaded(llm_loads: Sequence[float]) -> tuple[list[int], list[int], int | None]:
    """(OL indices ascending, UL indices ascending, median index or None) for microbatch LLM loads."""
    k = len(llm_loads)
    ranked = sorted(range(k), key=lambda i: (-llm_loads[i], i))
    half = k // 2
    median = ranked[half] if k % 2 else None
    return sorted(ranked[:half]), sorted(ranked[k - half :]), median


def _buckets(work: np.ndarray, total: float, num_buckets: int) -> np.ndarray:
    if total <= 0.0:
        return np.zeros(len(work), dtype=np.int64)
    b = np.rint(work * (num_buckets / total)).astype(np.int64)
    return np.where(work > 0.0, np.maximum(b, 1), 0)


def subset_table(work: np.ndarray, num_buckets: int = NUM_BUCKETS) -> SubsetTable:
    """Build the table for samples with LLM work ``work`` (already in ascending id order).

    Suffix min-count DP ``f[k][s]`` = fewest samples among ``k..n-1`` summing to ``s`` buckets;
    reconstruction from the front takes sample ``k`` whenever an optimal completion exists, which
    yields the lexicographically smallest id tuple among the fewest-sample subsets.
    """
    work = np.asarray(work, dtype=float)
    n = len(work)
    a = _buckets(work, math.fsum(work), num_buckets)
    width = int(a.sum()) + 1
    f = np.full((n + 1, width), _UNREACHABLE, dtype=np.int64)
    f[n, 0] = 0
    for k in range(n - 1, -1, -1):
        f[k] = f[k + 1]
        if a[k]:
            np.minimum(f[k, a[k] :], f[k + 1, : width - a[k]] + 1, out=f[k, a[k] :])
    sums = np.flatnonzero(f[0] < _UNREACHABLE)
    rem = sums.copy()
    cnt = f[0, sums].copy()
    members = np.zeros((len(sums), n), dtype=bool)
    for k in range(n):
        if not a[k]:
            continue
        prev = np.maximum(rem - a[k], 0)
        take = (rem >= a[k]) & (f[k + 1, prev] == cnt - 1)
        members[:, k] = take
        rem -= a[k] * take
        cnt -= take
    return SubsetTable(members, members.astype(float) @ work, members.sum(axis=1))


def _tie_break(table: SubsetTable, rows: np.ndarray) -> int:
    """Among tied representative rows: fewest samples, then smallest ids."""
    best = min(rows, key=lambda r: (table.count[r], [not m for m in table.members[r]]))
    return int(best)


def choose_deferrals(table: SubsetTable, w_i: float, w_partners: np.ndarray) -> np.ndarray:
    """Row of ``table`` chosen for each partner load in ``w_partners`` (see module docstring)."""
    w_partners = np.asarray(w_partners, dtype=float)
    cap = (w_i - w_partners)[:, None]
    dist = np.abs(table.exact[None, :] - cap / 2.0)
    dist[table.exact[None, :] > cap] = np.inf
    choice = np.argmin(dist, axis=1)
    best = dist[np.arange(len(w_partners)), choice]
    ties = (dist == best[:, None]).sum(axis=1) > 1
    for p in np.flatnonzero(ties):
        choice[p] = _tie_break(table, np.flatnonzero(dist[p] == best[p]))
    return choice


def deferral_candidates(
    ids: Sequence[Sequence[str]],
    llm_work: Sequence[Sequence[float]],
    num_buckets: int = NUM_BUCKETS,
) -> DeferralCandidates:
    """``V``, ``L`` and deferral sets for one replica's microbatches.

    ``ids[m]`` / ``llm_work[m]``: sample ids and LLM work of microbatch ``m`` (any order).
    """
    loads = [math.fsum(w) for w in llm_work]
    ol, ul, median = split_overloaded(loads)
    w_ul = np.array([loads[j] for j in ul], dtype=float)
    V = np.empty((len(ol), len(ul)))
    choices = np.empty((len(ol), len(ul)), dtype=np.int64)
    sorted_ids, tables = [], []
    for a, i in enumerate(ol):
        order = sorted(range(len(ids[i])), key=lambda k: ids[i][k])
        sorted_ids.append(tuple(ids[i][k] for k in order))
        table = subset_table(np.asarray(llm_work[i], dtype=float)[order], num_buckets)
        tables.append(table)
        choices[a] = choose_deferrals(table, loads[i], w_ul)
        d = table.exact[choices[a]]
        V[a] = np.maximum(loads[i] - d, w_ul + d)
    L = np.array([loads[i] for i in ol], dtype=float)
    return DeferralCandidates(tuple(ol), tuple(ul), median, V, L, tuple(sorted_ids), tuple(tables), choices)
