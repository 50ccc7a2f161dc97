"""BottleneckMatch (paper §5.2 step 3, Algorithm 3 line 13).

Given ``V`` (OL rows x UL columns: the larger LLM load of the pair after the chosen deferral) and
``L`` (an OL microbatch's LLM load when it defers nothing), find the smallest threshold ``T*`` in
``V ∪ L`` such that every *critical* OL row (``L[i] > T``) can be matched to a distinct UL column
through an edge ``V[i, j] <= T``. Feasibility is monotone in ``T`` and ``T = max(L)`` is always
feasible (no critical row), so a binary search over the sorted unique candidates finds ``T*``.
The matching is SciPy's ``maximum_bipartite_matching`` (Hopcroft-Karp) on the critical rows, which
is deterministic for a given ``V``, ``L``.

Non-critical rows are completed by ``complete_pairing``: the unmatched OL rows, in row order, take
the unused UL columns in column order, with no deferral.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

__all__ = ["bottleneck_match", "complete_pairing"]


def _critical_matching(V: np.ndarray, L: np.ndarray, threshold: float) -> np.ndarray | None:
    """Column for each row (-1 for non-critical rows) if every critical row is matched, else None."""
    match = np.full(len(L), -1, dtype=np.int64)
    critical = np.flatnonzero(L > threshold)
    if critical.size == 0:
        return match
    edges = V[critical] <= threshold
    if not edges.any(axis=1).all():
        return None
    cols = maximum_bipartite_matching(csr_matrix(edges.astype(np.int8)), perm_type="column")
    if np.any(cols < 0):
        return None
    match[critical] = cols
    return match


def bottleneck_match(V: np.ndarray, L: np.ndarray) -> tuple[float, np.ndarray]:
    """Return ``(T*, match)``: ``match[i]`` is the UL column of critical row ``i``, -1 otherwise.

    ``V`` has shape (num_OL, num_UL) with num_UL >= num_OL; ``L`` has shape (num_OL,). With no OL
    rows, ``T* = 0``.
    """
    V = np.asarray(V, dtype=float)
    L = np.asarray(L, dtype=float)
    if L.size == 0:
        return 0.0, np.zeros(0, dtype=np.int64)
    candidates = np.unique(np.concatenate([V.ravel(), L]))
    # every row ends at or below T either alone (L[i]) or paired (some V[i, j]); V[i, j] <= L[i]
    lower_bound = np.minimum(V.min(axis=1, initial=np.inf), L).max()
    lo, hi = int(np.searchsorted(candidates, lower_bound)), len(candidates) - 1
    best = _critical_matching(V, L, candidates[hi])
    assert best is not None  # T = max(V ∪ L) >= max(L): nothing is critical
    while lo < hi:
        mid = (lo + hi) // 2
        match = _critical_matching(V, L, candidates[mid])
        if match is None:
            lo = mid + 1
        else:
            hi, best = mid, match  # best always holds the matching at candidates[hi]
    return float(candidates[hi]), best


def complete_pairing(match: np.ndarray, num_ul: int) -> list[tuple[int, int, bool]]:
    """Every OL row's (row, UL column, defers?) triple, in row order.

    Critical rows keep their matched column and defer; the other rows take the unused columns in
    ascending order and defer nothing.
    """
    used = {int(c) for c in match if c >= 0}
    free = iter(c for c in range(num_ul) if c not in used)
    return [(i, int(c), True) if c >= 0 else (i, next(free), False) for i, c in enumerate(match)]
