"""Min-max layer partition (paper Eq. 1) against brute force."""

from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from entrain.core.errors import ConfigError
from entrain.core.planning.partition import min_max_partition, stage_times


def brute_force(layers, p):
    n = len(layers)
    best = None
    for cuts in combinations(range(1, n), p - 1):  # lexicographic order of boundaries
        edges = (0, *cuts, n)
        ranges = list(zip(edges[:-1], edges[1:]))
        bottleneck = max(stage_times(layers, ranges))
        if best is None or bottleneck < best[0]:
            best = (bottleneck, ranges)
    return best


@given(
    st.lists(st.integers(0, 20), min_size=1, max_size=9),
    st.integers(1, 9),
)
def test_matches_brute_force_integers(layers, p):
    p = min(p, len(layers))
    part = min_max_partition(layers, p)
    bottleneck, ranges = brute_force(layers, p)
    assert part.bottleneck_ms == bottleneck
    assert list(part.ranges) == ranges  # same lexicographic tie-break as the enumeration
    assert part.ranges[0][0] == 0 and part.ranges[-1][1] == len(layers)
    assert all(f < e for f, e in part.ranges)
    assert sum(part.stage_ms) == sum(layers)


@given(st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=1, max_size=8), st.integers(1, 8))
def test_matches_brute_force_floats(layers, p):
    p = min(p, len(layers))
    part = min_max_partition(layers, p)
    bottleneck, _ = brute_force(layers, p)
    assert part.bottleneck_ms == pytest.approx(bottleneck, rel=1e-9, abs=1e-12)


def test_examples():
    part = min_max_partition([1, 1, 1, 1, 4], 2)
    assert part.ranges == ((0, 4), (4, 5)) and part.stage_ms == (4.0, 4.0)
    part = min_max_partition([2, 2, 2, 2], 2)
    assert part.ranges == ((0, 2), (2, 4))
    # ties: earliest stages as short as possible
    part = min_max_partition([1, 0, 0, 1], 2)
    assert part.ranges == ((0, 1), (1, 4))
    assert min_max_partition([5.0], 1).ranges == ((0, 1),)


def test_bad_stage_counts():
    with pytest.raises(ConfigError, match="cannot split 3 layers into 4"):
        min_max_partition([1, 2, 3], 4)
    with pytest.raises(ConfigError):
        min_max_partition([1, 2, 3], 0)
