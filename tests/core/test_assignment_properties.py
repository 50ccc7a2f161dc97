"""Hypothesis property tests of Entrain's hierarchical assignment: safety
(each sample once, determinism, deferral shape) on the shared strategies of assignment_strategies.py;
quality against oracles is in test_assignment_quality.py."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from entrain.core.assignment.deferral import deferral_candidates
from entrain.core.assignment.dp_split import split_dp
from entrain.core.assignment.hierarchical import assign_entrain
from entrain.core.assignment.matching import bottleneck_match

from .assignment_strategies import batches


def _tol(x: float) -> float:
    return 1e-9 * max(1.0, abs(x))


@given(batches())
def test_every_sample_once_and_equal_replica_sizes(case):
    batch, dp, k = case
    it = assign_entrain(batch, dp, k)
    ids = sorted(s.id for s in batch)
    enc = [s for r in it.replicas for mb in r.encoder_microbatches for s in mb]
    llm = [s for r in it.replicas for mb in r.llm_microbatches for s in mb]
    assert sorted(enc) == ids and sorted(llm) == ids
    assert len(it.replicas) == dp
    for r in it.replicas:
        assert sorted(r.sample_ids) == sorted(s for mb in r.llm_microbatches for s in mb)
        assert len(r.sample_ids) == len(batch) // dp
        assert 1 <= r.k_eff <= k
        assert all(len(mb) > 0 for mb in r.encoder_microbatches)


@given(batches())
def test_deferral_only_from_ol_to_the_partner_run_right_after(case):
    batch, dp, k = case
    llm_of = {s.id: s.llm for s in batch}
    for r in assign_entrain(batch, dp, k).replicas:
        pos = {mb: p for p, mb in enumerate(r.execution_order)}
        before = [math.fsum(llm_of[s] for s in mb) for mb in r.encoder_microbatches]
        for d in r.deferrals:
            assert pos[d.to_mb] == pos[d.from_mb] + 1
            assert pos[d.from_mb] % 2 == 0  # the OL microbatch opens its pair
            assert before[d.from_mb] >= before[d.to_mb]
            assert d.id in r.encoder_microbatches[d.from_mb]
            assert d.id in r.llm_microbatches[d.to_mb] and d.id not in r.llm_microbatches[d.from_mb]
        # no other sample changes microbatch between encoder and LLM
        moved = {d.id for d in r.deferrals}
        for i, mb in enumerate(r.encoder_microbatches):
            assert [s for s in mb if s not in moved] == [s for s in r.llm_microbatches[i] if s not in moved]


@given(batches())
def test_largest_llm_microbatch_never_grows(case):
    batch, dp, k = case
    llm_of = {s.id: s.llm for s in batch}
    for r in assign_entrain(batch, dp, k).replicas:
        before = max(math.fsum(llm_of[s] for s in mb) for mb in r.encoder_microbatches)
        assert max(r.llm_work) <= before + _tol(before)
        # every LLM microbatch of a pair stays within the pair's larger pre-deferral load
        for p in range(0, len(r.execution_order) - 1, 2):
            ol, ul = r.execution_order[p], r.execution_order[p + 1]
            w_ol = math.fsum(llm_of[s] for s in r.encoder_microbatches[ol])
            assert r.llm_work[ol] <= w_ol + _tol(w_ol) and r.llm_work[ul] <= w_ol + _tol(w_ol)


@given(batches())
def test_encoder_lpt_within_graham_bound(case):
    """List scheduling (any list order, so also coarse-then-fine) guarantees
    ``max_load <= sum/K + (1 - 1/K) * p_max``: when the last sample of the heaviest microbatch was
    placed, that microbatch was the least loaded, so its load then was at most (sum - p)/K.
    This implies Graham's ``(2 - 1/K) * max(mean, p_max)``, which we check too."""
    batch, dp, k = case
    enc_of = {s.id: s.encoder for s in batch}
    for r in assign_entrain(batch, dp, k).replicas:
        works = [enc_of[s] for s in r.sample_ids]
        total, p_max, kk = math.fsum(works), max(works), r.k_eff
        bound = total / kk + (1 - 1 / kk) * p_max
        assert max(r.encoder_work) <= bound + _tol(bound)
        graham = (2 - 1 / kk) * max(total / kk, p_max)
        assert max(r.encoder_work) <= graham + _tol(graham)


@given(batches(), st.integers(0, 2**32 - 1))
def test_deterministic_and_independent_of_input_order(case, seed):
    batch, dp, k = case
    first = assign_entrain(batch, dp, k)
    assert assign_entrain(list(batch), dp, k) == first
    shuffled = list(batch)
    random.Random(seed).shuffle(shuffled)
    assert assign_entrain(shuffled, dp, k) == first


@given(batches())
def test_dp_split_sizes(case):
    batch, dp, _ = case
    reps = split_dp(batch, dp)
    assert [len(r) for r in reps] == [len(batch) // dp] * dp


@st.composite
def v_and_l(draw):
    m = draw(st.integers(1, 4))
    values = st.integers(0, 12).map(float)
    L = np.array(draw(st.lists(values, min_size=m, max_size=m)))
    V = np.array([[min(L[i], draw(values)) for _ in range(m)] for i in range(m)])  # V <= L by construction
    return V, L


@given(v_and_l())
def test_bottleneck_match_equals_brute_force(case):
    V, L = case
    m = len(L)
    t_star, match = bottleneck_match(V, L)
    # brute force: the best max-load over every full pairing, each row deferring or not
    best = min(max(min(L[i], V[i, perm[i]]) for i in range(m)) for perm in itertools.permutations(range(m)))
    assert t_star == best
    used = [c for c in match if c >= 0]
    assert len(used) == len(set(used))
    for i in range(m):
        assert (L[i] <= t_star and match[i] == -1) or (L[i] > t_star and V[i, match[i]] <= t_star)


@given(st.lists(st.integers(0, 9), min_size=1, max_size=7), st.integers(0, 40))
def test_subset_choice_equals_brute_force_when_buckets_are_exact(works, w_ul):
    """With integer work and one bucket per unit, the DP's pick must be the exhaustive optimum:
    closest to delta, not above the gap, then fewest samples, then smallest ids."""
    total = sum(works)
    if total <= w_ul:
        w_ul = 0
    ol_ids = [f"a{i}" for i in range(len(works))]
    cand = deferral_candidates(
        [ol_ids, ["b"]], [[float(w) for w in works], [float(w_ul)]], num_buckets=max(1, total)
    )
    assert cand.ol == (0,) and cand.ul == (1,)
    gap, delta = total - w_ul, (total - w_ul) / 2
    best = min(
        (
            (abs(sum(works[i] for i in sub) - delta), len(sub), list(sub))
            for r in range(len(works) + 1)
            for sub in itertools.combinations(range(len(works)), r)
            if sum(works[i] for i in sub) <= gap
        ),
    )
    assert cand.deferred(0, 0) == tuple(ol_ids[i] for i in best[2])
    assert cand.V[0, 0] == max(total - sum(works[i] for i in best[2]), w_ul + sum(works[i] for i in best[2]))
