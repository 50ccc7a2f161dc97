"""LLM balance of the paper's DP split (docs/design.md §1.2) against an exhaustive oracle.

``split_dp`` sorts the global batch by encoder work and hands each sample to the open replica
(fewer than ``B / dp`` samples) with the least LLM work. When LLM work grows with encoder work (the
usual case: image tokens feed both), that order is LLM-descending and the split is LPT with a
cardinality constraint, which keeps Graham's list-scheduling bound:

    max replica LLM load <= OPT + (1 - 1/dp) * p_max      and      max - min <= p_max

where OPT is the best max load over all splits into ``dp`` groups of ``B / dp`` samples (computed
exhaustively here for tiny batches) and ``p_max`` the largest sample's LLM work. A split that stops
balancing one replica (e.g. replica 0 takes its first sample, then only the leftovers) breaks both.
For LLM work unrelated to encoder work the split gives no such bound (light samples drawn first
can fill a replica), so these tests draw co-monotone batches only.
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from entrain.core.assignment.dp_split import split_dp
from entrain.core.workload.work import SampleWork

# few distinct values, heavy and light: ties and near-equal heavy samples are where a replica
# that stops being balanced shows
_LLM_WORK = st.sampled_from([0.0, 1.0, 2.0, 7.0, 8.0, 9.0, 10.0])


def _co_monotone(llm_work: list[float]) -> list[SampleWork]:
    """Samples whose encoder work is an increasing function of their LLM work."""
    return [SampleWork(f"s{i:02d}", 3.0 * w + 1.0, w) for i, w in enumerate(llm_work)]


@st.composite
def _tiny_batches(draw) -> tuple[list[SampleWork], int]:
    dp = draw(st.integers(2, 3))
    per_replica = draw(st.integers(1, 4 if dp == 2 else 3))
    return _co_monotone(draw(st.lists(_LLM_WORK, min_size=dp * per_replica, max_size=dp * per_replica))), dp


def _exhaustive_best_max_load(llm_work: list[float], dp: int) -> float:
    """Least possible max load over all splits of ``llm_work`` into ``dp`` groups of equal size."""
    per_replica = len(llm_work) // dp
    best = math.inf

    def place(i: int, loads: list[float], counts: list[int]) -> None:
        nonlocal best
        if i == len(llm_work):
            best = min(best, max(loads))
            return
        tried = set()
        for r in range(dp):  # replicas with equal (load, count) are interchangeable: try one
            if counts[r] < per_replica and (loads[r], counts[r]) not in tried:
                tried.add((loads[r], counts[r]))
                loads[r] += llm_work[i]
                counts[r] += 1
                if loads[r] < best:
                    place(i + 1, loads, counts)
                loads[r] -= llm_work[i]
                counts[r] -= 1

    place(0, [0.0] * dp, [0] * dp)
    return best


def _replica_loads(batch: list[SampleWork], dp: int) -> list[float]:
    return [math.fsum(s.llm for s in replica) for replica in split_dp(batch, dp)]


def test_oracle_finds_the_balanced_split():
    assert _exhaustive_best_max_load([10.0, 10.0, 10.0, 10.0, 0.0, 0.0], 2) == 20.0
    assert _exhaustive_best_max_load([9.0, 5.0, 4.0, 1.0], 2) == 10.0


@given(_tiny_batches())
def test_max_llm_load_within_graham_bound_of_the_exhaustive_optimum(case):
    batch, dp = case
    llm_work = [s.llm for s in batch]
    best = _exhaustive_best_max_load(llm_work, dp)
    bound = best + (1 - 1 / dp) * max(llm_work)
    assert max(_replica_loads(batch, dp)) <= bound + 1e-9, (llm_work, dp, best)


@given(st.integers(2, 4), st.integers(1, 8), st.data())
def test_replica_llm_loads_differ_by_at_most_the_largest_sample(dp, per_replica, data):
    llm_work = data.draw(st.lists(_LLM_WORK, min_size=dp * per_replica, max_size=dp * per_replica))
    loads = _replica_loads(_co_monotone(llm_work), dp)
    assert max(loads) - min(loads) <= max(llm_work) + 1e-9, (llm_work, dp, loads)
