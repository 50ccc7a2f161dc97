"""Orders of Entrain's deferral pairs (``schedules.pairs.ordered_pairs``): a reorder moves whole pairs
(each OL microbatch still followed at once by the UL partner its deferred samples run with), keeps an
odd ``K_eff``'s median last, changes nothing else of the assignment, and sorts the pairs by the weight
given, ties in Algorithm 3's order."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from entrain.core.assignment.hierarchical import assign_replica
from entrain.core.schedules.pairs import PAIR_ORDER_CANDIDATES, ordered_pairs
from entrain.core.workload.work import SampleWork


@st.composite
def replicas(draw):
    n = draw(st.integers(2, 24))
    works = [
        SampleWork(f"s{i:02d}", draw(st.floats(0.0, 50.0)), draw(st.floats(0.1, 50.0))) for i in range(n)
    ]
    k = draw(st.integers(1, min(n, 9)))
    return assign_replica(works, k), {w.id: w for w in works}


def _weight(samples):
    def ms(rep, i):
        return sum(samples[s].encoder for s in rep.encoder_microbatches[i]) + sum(
            samples[s].llm for s in rep.llm_microbatches[i]
        )

    return ms


@given(case=replicas(), order=st.sampled_from(PAIR_ORDER_CANDIDATES))
def test_a_reorder_moves_whole_pairs_by_weight_and_keeps_the_median_last(case, order):
    rep, samples = case
    got = ordered_pairs(rep, order, _weight(samples))
    n_pairs = rep.k_eff // 2
    if n_pairs < 2:
        assert got is None
        return
    assert replace(got, execution_order=rep.execution_order) == rep  # only the order moves
    pairs = [rep.execution_order[i : i + 2] for i in range(0, 2 * n_pairs, 2)]
    moved = [got.execution_order[i : i + 2] for i in range(0, 2 * n_pairs, 2)]
    assert sorted(moved) == sorted(pairs)  # the same pairs, each OL then its UL
    assert got.execution_order[2 * n_pairs :] == rep.execution_order[2 * n_pairs :]  # the median last
    for d in got.deferrals:  # a deferred sample's LLM work runs in the very next slot
        pos = got.execution_order.index(d.from_mb)
        assert pos % 2 == 0 and got.execution_order[pos + 1] == d.to_mb
    ms = _weight(samples)
    weights = [ms(got, a) + ms(got, b) for a, b in moved]
    keys = [(w, pairs.index(p)) for w, p in zip(weights, moved)]
    assert keys == sorted(keys, key=lambda x: (x[0] if order == "light first" else -x[0], x[1]))


def test_an_unknown_order_is_refused():
    rep = assign_replica([SampleWork(f"s{i}", 1.0 + i, 1.0) for i in range(8)], 4)
    with pytest.raises(ValueError, match="light first"):
        ordered_pairs(rep, "middle", lambda r, i: 0.0)
