"""1-D min-max layer partition (paper Eq. 1): split a component's ordered layers into contiguous
pipeline stages minimising the slowest stage.

``F(l, p) = min_{l' < l} max(F(l', p-1), sum(T[l'..l)))``. Every stage holds at least one layer.
Tie-break (deterministic): among partitions with the optimal bottleneck, the lexicographically
smallest tuple of stage boundaries, i.e. earlier stages as short as possible (they hold the most
in-flight activations under 1F1B).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from entrain.core.errors import ConfigError

__all__ = ["Partition", "min_max_partition", "stage_times"]

_REL_TOL = 1e-12


@dataclass(frozen=True, slots=True)
class Partition:
    """Stage ``s`` holds layers ``[ranges[s][0], ranges[s][1])`` and takes ``stage_ms[s]``."""

    ranges: tuple[tuple[int, int], ...]
    stage_ms: tuple[float, ...]

    @property
    def bottleneck_ms(self) -> float:
        return max(self.stage_ms)

    @property
    def num_stages(self) -> int:
        return len(self.ranges)


def stage_times(layer_ms: Sequence[float], ranges: Sequence[tuple[int, int]]) -> tuple[float, ...]:
    """Sum of ``layer_ms`` over each ``[first, end)`` range."""
    prefix = [0.0, *accumulate(float(x) for x in layer_ms)]
    return tuple(prefix[e] - prefix[f] for f, e in ranges)


def _suffix_table(
    prefix: list[float], num_stages: int, forbidden_cuts: Collection[int] = ()
) -> list[list[float]]:
    """``suffix[q][i]``: the best bottleneck of layers ``[i, n)`` in ``q`` stages (inf if fewer than ``q``
    layers are left), ``min_j max(seg(i, j), suffix[q - 1][j])`` for ``j`` in ``i + 1 .. n - q + 1`` not in
    ``forbidden_cuts``: one numpy pass per stage count over the matrix of segment sums (the same float operations as
    the scalar recurrence, so the same values)."""
    n = len(prefix) - 1
    p = np.asarray(prefix)
    seg = p[None, :] - p[:, None]  # seg[i, j] = prefix[j] - prefix[i]
    rows, cols = np.indices(seg.shape)
    suffix = np.full((num_stages + 1, n + 1), np.inf)
    suffix[1, :n] = seg[:n, n]
    for q in range(2, num_stages + 1):
        cand = np.maximum(seg, suffix[q - 1][None, :])
        cand[(cols <= rows) | (cols > n - q + 1)] = np.inf
        if forbidden_cuts:
            cand[:, sorted(forbidden_cuts)] = np.inf
        suffix[q, : n - q + 1] = cand[: n - q + 1].min(axis=1)
    return suffix.tolist()


def min_max_partition(
    layer_ms: Sequence[float], num_stages: int, forbidden_cuts: Collection[int] = ()
) -> Partition:
    """Optimal contiguous split of ``layer_ms`` (per-layer times, >= 0) into ``num_stages`` stages, no
    stage ending at a cut point of ``forbidden_cuts`` (``j``: between layers ``j - 1`` and ``j``; a
    family's ``LayerSpec.no_cut_after``, ``CostModel.forbidden_cuts``).

    Raises ConfigError if ``num_stages`` is not in ``1..len(layer_ms)`` or the forbidden cuts leave no
    split into ``num_stages`` stages.
    """
    n = len(layer_ms)
    if not 1 <= num_stages <= n:
        raise ConfigError(f"cannot split {n} layers into {num_stages} stages (need 1..{n})")
    if any(x < 0 for x in layer_ms):
        raise ConfigError("layer times must be non-negative")
    prefix = [0.0, *accumulate(float(x) for x in layer_ms)]

    def seg(i: int, j: int) -> float:
        return prefix[j] - prefix[i]

    forbidden = frozenset(j for j in forbidden_cuts if 0 < j < n)
    suffix = _suffix_table(prefix, num_stages, forbidden)
    best = suffix[num_stages][0]
    if best == np.inf:
        raise ConfigError(
            f"cannot split {n} layers into {num_stages} stages without cutting where the model forbids it "
            f"(after layers {sorted(j - 1 for j in forbidden)})"
        )
    limit = best + _REL_TOL * max(abs(best), 1.0)

    bounds, start = [], 0
    for q in range(num_stages, 1, -1):  # choose the shortest feasible stage each time
        end = next(
            j
            for j in range(start + 1, n - q + 2)
            if j not in forbidden and seg(start, j) <= limit and suffix[q - 1][j] <= limit
        )
        bounds.append((start, end))
        start = end
    bounds.append((start, n))
    return Partition(tuple(bounds), stage_times(layer_ms, bounds))
