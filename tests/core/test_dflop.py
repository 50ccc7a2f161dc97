"""The ``dflop`` baseline's online microbatch scheduler (``assignment.batchers.dflop``): DFLOP's min-max ILP over
both modules' predicted times, its LPT incumbent and the mapping of groups to replicas."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from entrain.core.assignment.batchers.dflop import _objective, assign_dflop, ilp_groups, minmax_lpt
from entrain.core.workload.work import SampleWork


def _brute_force(costs: np.ndarray, groups: int) -> float:
    best = float("inf")
    for labels in itertools.product(range(groups), repeat=len(costs)):
        parts = [[i for i, g in enumerate(labels) if g == j] for j in range(groups)]
        if all(parts):
            best = min(best, _objective(costs, parts))
    return best


def test_ilp_finds_the_min_max_partition():
    costs = np.array([[7.0, 1.0], [1.0, 7.0], [4.0, 4.0], [3.0, 2.0], [2.0, 3.0], [5.0, 1.0], [1.0, 5.0]])
    got = ilp_groups(costs, 3)
    assert got is not None
    assert sorted(i for g in got for i in g) == list(range(len(costs)))
    assert all(got)
    assert _objective(costs, got) == _brute_force(costs, 3)


def test_lpt_incumbent_is_a_partition_with_no_empty_group():
    costs = np.array([[1.0, 9.0], [9.0, 1.0], [1.0, 1.0], [2.0, 2.0], [3.0, 1.0]])
    got = minmax_lpt(costs, 4)
    assert sorted(i for g in got for i in g) == list(range(5)) and all(got)


def test_assignment_maps_groups_to_replicas_with_variable_sizes():
    # two encoder-heavy samples: the optimum (max 12) holds each alone, the 14 light ones in the others
    batch = [SampleWork(f"s{i:02d}", 12.0 if i < 2 else 1.0, 1.0) for i in range(16)]
    got = assign_dflop(batch, 2, 2)
    assert len(got.replicas) == 2 and all(rep.k_eff == 2 for rep in got.replicas)
    ids = sorted(s for rep in got.replicas for s in rep.sample_ids)
    assert ids == sorted(s.id for s in batch)
    for rep in got.replicas:
        assert rep.encoder_microbatches == rep.llm_microbatches  # each group's encoder on its replica
    work = {s.id: s for s in batch}
    loads = [
        max(sum(work[s].encoder for s in mb), sum(work[s].llm for s in mb))
        for rep in got.replicas
        for mb in rep.encoder_microbatches
    ]
    costs = np.array([[s.encoder, s.llm] for s in batch])
    assert max(loads) == _exact(costs, 4) == 12.0
    assert sorted(len(mb) for rep in got.replicas for mb in rep.encoder_microbatches) == [1, 1, 7, 7]


def _exact(costs: np.ndarray, groups: int) -> float:
    """The ILP optimum of this 16-sample instance through the exact solver (brute force is 4^16)."""
    exact = ilp_groups(costs, groups)
    assert exact is not None
    return _objective(costs, exact)


def test_the_batcher_takes_the_ilp_where_lpt_falls_short():
    """Encoder work 3, 3, 2, 2, 2, 0.01 on two groups: LPT ends at 7, the ILP at 6.01 (3+3 | 2+2+2)."""
    enc = [3.0, 3.0, 2.0, 2.0, 2.0, 0.01]
    batch = [SampleWork(f"s{i}", e, 0.01) for i, e in enumerate(enc)]
    costs = np.array([[s.encoder, s.llm] for s in batch])
    assert _objective(costs, minmax_lpt(costs, 2)) == 7.0  # LPT: 3+2+2
    got = assign_dflop(batch, 2, 1)
    work = {s.id: s.encoder for s in batch}
    loads = [sum(work[s] for s in rep.encoder_microbatches[0]) for rep in got.replicas]
    assert max(loads) == pytest.approx(6.01)
