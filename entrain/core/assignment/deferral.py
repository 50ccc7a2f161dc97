"""Pairwise deferral candidates (paper §5.2 steps 1-2, Algorithm 3 lines 7-12): subset-sum DP, ``V``, ``L``.

Pinned (docs/design.md §1.2):

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

Implementation: the tables of all OL microbatches of a replica are built together as one numpy
array DP (rows = OL microbatches, samples padded with zero-work entries), ``O(n_max * 256)``
vectorised steps; the queries for all (OL, UL) pairs are one ``O(K^2 * 256)`` array pass
(in row blocks to bound memory).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "NUM_BUCKETS",
    "SubsetTables",
    "DeferralCandidates",
    "split_overloaded",
    "subset_tables",
    "subset_table",
    "choose_deferrals",
    "deferral_candidates",
]

NUM_BUCKETS = 256
_INF = np.int32(1 << 28)
_QUERY_BLOCK_ELEMENTS = 1 << 21


@dataclass(frozen=True)
class SubsetTables:
    """Representative subsets of several OL microbatches' samples (each in ascending id order,
    padded to ``n_max`` with zero-work samples that are never members).

    ``members[r, s]`` (bool per sample): the representative of row ``r`` reaching ``s`` buckets;
    ``exact[r, s]`` its exact LLM sum (``inf`` where ``s`` is unreachable); ``count[r, s]`` its size.
    """

    members: np.ndarray
    exact: np.ndarray
    count: np.ndarray


def split_overloaded(llm_loads: Sequence[float]) -> tuple[list[int], list[int], int | None]:
    """(OL indices ascending, UL indices ascending, median index or None) for microbatch LLM loads."""
    k = len(llm_loads)
    ranked = sorted(range(k), key=lambda i: (-llm_loads[i], i))
    half = k // 2
    median = ranked[half] if k % 2 else None
    return sorted(ranked[:half]), sorted(ranked[k - half :]), median


def _buckets(work: np.ndarray, totals: np.ndarray, num_buckets: int) -> np.ndarray:
    scale = np.divide(num_buckets, totals, out=np.zeros_like(totals), where=totals > 0)
    b = np.rint(work * scale[:, None]).astype(np.int32)
    return np.where(work > 0.0, np.maximum(b, 1), 0).astype(np.int32)


def subset_tables(works: Sequence[Sequence[float]], num_buckets: int = NUM_BUCKETS) -> SubsetTables:
    """Tables for each row's sample LLM work (samples already in ascending id order).

    Suffix min-count DP ``f[k][r, s]`` = fewest samples among ``k..n-1`` of row ``r`` summing to
    ``s`` buckets; reconstruction from the front takes sample ``k`` whenever an optimal completion
    exists, which yields the lexicographically smallest id tuple among the fewest-sample subsets.
    """
    m = len(works)
    n = max((len(w) for w in works), default=0)
    x = np.zeros((m, n))
    for r, w in enumerate(works):
        x[r, : len(w)] = w
    a = _buckets(x, np.array([math.fsum(w) for w in works]), num_buckets)
    width = int(a.sum(axis=1).max(initial=0)) + 1
    cols = np.arange(width, dtype=np.int32)[None, :]
    f = np.full((n + 1, m, width), _INF, dtype=np.int32)
    f[n, :, 0] = 0
    for k in range(n - 1, -1, -1):
        src = cols - a[:, k : k + 1]
        shifted = np.take_along_axis(f[k + 1], np.maximum(src, 0), axis=1) + 1
        shifted[src < 0] = _INF
        np.minimum(f[k + 1], shifted, out=f[k])
    reachable = f[0] < _INF
    rem = np.broadcast_to(cols, (m, width)).copy()
    cnt = f[0].copy()
    members = np.zeros((m, width, n), dtype=bool)
    for k in range(n):
        ak = a[:, k : k + 1]
        prev = np.take_along_axis(f[k + 1], np.maximum(rem - ak, 0), axis=1)
        take = reachable & (ak > 0) & (rem >= ak) & (prev == cnt - 1)
        members[:, :, k] = take
        rem -= ak * take
        cnt -= take
    exact = np.matmul(members.astype(float), x[:, :, None])[:, :, 0]
    exact[~reachable] = np.inf
    return SubsetTables(members, exact, members.sum(axis=2))


def subset_table(work: Sequence[float], num_buckets: int = NUM_BUCKETS) -> SubsetTables:
    """One microbatch's table restricted to reachable sums (row 0 = the empty subset); 2-D fields."""
    t = subset_tables([list(work)], num_buckets)
    keep = np.isfinite(t.exact[0])
    return SubsetTables(t.members[0][keep], t.exact[0][keep], t.count[0][keep])


def _tie_break(members: np.ndarray, count: np.ndarray, cands: np.ndarray) -> int:
    """Among tied candidate sums: fewest samples, then smallest ids."""
    return int(min(cands, key=lambda s: (count[s], [not b for b in members[s]])))


def choose_deferrals(tables: SubsetTables, loads: np.ndarray, w_partners: np.ndarray) -> np.ndarray:
    """``choice[r, j]``: the bucket sum whose representative row ``r`` defers to partner ``j``.

    Only reachable sums are scanned (at most ``min(2^n, 256 + n)`` per row, usually far fewer).
    """
    m, width = tables.exact.shape
    u = len(w_partners)
    reachable = np.isfinite(tables.exact)
    num_reach = int(reachable.sum(axis=1).max(initial=1))
    sums = np.argsort(~reachable, axis=1, kind="stable")[:, :num_reach]  # reachable sums first, ascending
    exact = np.take_along_axis(tables.exact, sums, axis=1)
    choice = np.zeros((m, u), dtype=np.int64)
    step = max(1, _QUERY_BLOCK_ELEMENTS // max(1, u * num_reach))
    for lo in range(0, m, step):
        e = exact[lo : lo + step, None, :]
        cap = (loads[lo : lo + step, None] - w_partners[None, :])[:, :, None]
        dist = np.abs(e - cap / 2.0)
        dist[e > cap] = np.inf
        c = np.argmin(dist, axis=2)
        best = np.take_along_axis(dist, c[:, :, None], axis=2)
        c = np.take_along_axis(sums[lo : lo + step, None, :], c[:, :, None], axis=2)[:, :, 0]
        for r, j in np.argwhere((dist == best).sum(axis=2) > 1):
            cands = sums[lo + r][dist[r, j] == best[r, j, 0]]
            c[r, j] = _tie_break(tables.members[lo + r], tables.count[lo + r], cands)
        choice[lo : lo + step] = c
    return choice


@dataclass(frozen=True)
class DeferralCandidates:
    """``V`` (num_OL x num_UL), ``L`` (num_OL) and what ``deferred(row, col)`` needs."""

    ol: tuple[int, ...]
    ul: tuple[int, ...]
    median: int | None
    V: np.ndarray
    L: np.ndarray
    sorted_ids: tuple[tuple[str, ...], ...]
    tables: SubsetTables
    choices: np.ndarray
    """``choices[row, col]``: the bucket sum of ``tables`` row ``row`` chosen for that partner."""

    def deferred(self, row: int, col: int) -> tuple[str, ...]:
        """Ids (ascending) that OL row ``row`` defers when paired with UL column ``col``."""
        members = self.tables.members[row, self.choices[row, col]]
        return tuple(s for s, m in zip(self.sorted_ids[row], members) if m)


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
    L = np.array([loads[i] for i in ol], dtype=float)
    orders = [sorted(range(len(ids[i])), key=ids[i].__getitem__) for i in ol]
    sorted_ids = tuple(tuple(ids[i][k] for k in o) for i, o in zip(ol, orders))
    tables = subset_tables([[llm_work[i][k] for k in o] for i, o in zip(ol, orders)], num_buckets)
    choices = choose_deferrals(tables, L, w_ul)
    d = np.take_along_axis(tables.exact, choices, axis=1) if len(ol) else np.zeros((0, len(ul)))
    V = np.maximum(L[:, None] - d, w_ul[None, :] + d)
    return DeferralCandidates(tuple(ol), tuple(ul), median, V, L, sorted_ids, tables, choices)
