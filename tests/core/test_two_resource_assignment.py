"""The two-resource assignment (``assignment.two_resource``): the safety and quality properties the
paper's assignment has (each sample once, determinism, list-scheduling bound, deferral never raises a
pair's larger load), plus what it is for: on LLM-dominant draws its largest LLM microbatch is never
larger than the paper assignment's, and it removes the paper's LLM pile-up."""

from __future__ import annotations

import math
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.assignment.dp_split import split_dp
from entrain.core.assignment.hierarchical import assign_replica
from entrain.core.assignment.stratified import effective_num_microbatches
from entrain.core.assignment.two_resource import (
    EQUAL_SHARES,
    RankShares,
    assign_replica_two_resource,
    microbatch_sizes,
    replica_loads,
    split_dp_two_resource,
    two_resource_k,
    vector_lpt,
)
from entrain.core.workload.work import SampleWork

from .assignment_strategies import batches

FEW = settings(max_examples=25)


def _replicas(case):
    batch, dp, k = case
    return [(r, k) for r in split_dp(batch, dp)]


@st.composite
def shares(draw) -> RankShares:
    """Per-rank shares of a chain of 1-3 encoder ranks then 1-3 LLM ranks, or one shared rank."""
    enc = draw(st.lists(st.floats(0.1, 1.0), min_size=1, max_size=3))
    llm = draw(st.lists(st.floats(0.1, 1.0), min_size=1, max_size=3))
    shared = draw(st.booleans())
    a = [x / sum(enc) for x in enc] + [0.0] * (len(llm) - shared)
    b = [0.0] * (len(enc) - shared) + [x / sum(llm) for x in llm]
    return RankShares(tuple(a), tuple(b))


@FEW
@given(batches(), shares())
def test_each_sample_once_and_k_never_below_the_papers(case, sh):
    for samples, k in _replicas(case):
        rep = assign_replica_two_resource(samples, k, sh)
        ids = sorted(s.id for s in samples)
        assert sorted(rep.sample_ids) == ids
        assert sorted(s for mb in rep.llm_microbatches for s in mb) == ids
        k_paper = effective_num_microbatches([s.encoder for s in samples], k)
        assert k_paper <= rep.k_eff <= k
        if len(samples) >= rep.k_eff:
            assert all(rep.encoder_microbatches)
        by_id = {s.id: s for s in samples}
        for mb, work in zip(rep.llm_microbatches, rep.llm_work):
            assert work == math.fsum(by_id[s].llm for s in mb)


@FEW
@given(batches(), shares(), st.randoms(use_true_random=False))
def test_deterministic_and_order_free(case, sh, rnd):
    for samples, k in _replicas(case):
        shuffled = list(samples)
        rnd.shuffle(shuffled)
        assert assign_replica_two_resource(samples, k, sh) == assign_replica_two_resource(shuffled, k, sh)


@FEW
@given(batches(), shares())
def test_vector_lpt_list_scheduling_bound(case, sh):
    """Largest microbatch size <= (summed per-rank work) / K + the largest sample's size."""
    for samples, k in _replicas(case):
        k2 = two_resource_k(samples, k, sh)
        bins = vector_lpt(samples, k2, sh)
        per_rank = np.array([(s.encoder, s.llm) for s in samples]) @ sh.matrix().T
        sizes = [
            max((np.sum([per_rank[samples.index(s)] for s in b], axis=0)).tolist() or [0.0]) for b in bins
        ]
        bound = per_rank.sum() / k2 + per_rank.max(axis=1).max()
        assert max(sizes) <= bound * (1 + 1e-9)


@FEW
@given(batches(), shares())
def test_never_worse_than_the_paper_on_its_objective(case, sh):
    for samples, k in _replicas(case):
        mine = microbatch_sizes(assign_replica_two_resource(samples, k, sh), sh).max()
        paper = microbatch_sizes(assign_replica(samples, k), sh).max()
        assert mine <= paper * (1 + 1e-12)


@FEW
@given(batches())
def test_deferral_never_raises_the_largest_llm_load(case):
    for samples, k in _replicas(case):
        k2 = two_resource_k(samples, k, EQUAL_SHARES)
        before = max(math.fsum(s.llm for s in b) for b in vector_lpt(samples, k2, EQUAL_SHARES))
        rep = assign_replica_two_resource(samples, k, EQUAL_SHARES)
        paper = assign_replica(samples, k)
        assert max(rep.llm_work) <= max(before, max(paper.llm_work)) * (1 + 1e-12)


@FEW
@given(batches(), shares(), st.randoms(use_true_random=False))
def test_dp_split_each_sample_once_equal_counts_order_free(case, sh, rnd):
    batch, dp, _ = case
    reps = split_dp_two_resource(batch, dp, sh)
    assert len(reps) == dp and {len(r) for r in reps} == {len(batch) // dp}
    assert sorted(s.id for r in reps for s in r) == sorted(s.id for s in batch)
    shuffled = list(batch)
    rnd.shuffle(shuffled)
    assert split_dp_two_resource(shuffled, dp, sh) == reps


def test_dp_split_balances_what_the_papers_leaves_to_its_last_sample():
    """The paper's split goes in encoder order and balances LLM load greedily: the last long text
    lands on the replica the sample count leaves open (LLM 40 vs 2); in rounds of one sample per
    replica, largest first, the two long texts go to different replicas (21 and 21)."""
    batch = [SampleWork("a", 2.0, 20.0), SampleWork("b", 1.5, 1.0), SampleWork("c", 1.0, 1.0),
             SampleWork("d", 0.5, 20.0)]  # fmt: skip
    paper = split_dp(batch, 2)
    assert replica_loads(paper, EQUAL_SHARES)[:, 1].tolist() == [40.0, 2.0]
    mine = split_dp_two_resource(batch, 2, EQUAL_SHARES)
    assert replica_loads(mine, EQUAL_SHARES)[:, 1].tolist() == [21.0, 21.0]


# --- LLM-dominant draws ---------------------------------------------------------


@st.composite
def llm_dominant(draw) -> tuple[list[SampleWork], int]:
    """One replica whose every sample has more LLM than encoder work. Hard for the paper's encoder
    stratification: many text-only samples (zero encoder work), a few small images, a heavy tail of
    long texts, and K from 4 to 16 with 2-6 samples a microbatch."""
    k = draw(st.integers(4, 16))
    n = k * draw(st.integers(2, 6))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    text_only = draw(st.floats(0.2, 0.9))
    heavy = draw(st.floats(0.0, 0.2))
    out = []
    for i in range(n):
        llm = rng.lognormvariate(3.0, 0.6) * (rng.uniform(5, 20) if rng.random() < heavy else 1.0)
        enc = 0.0 if rng.random() < text_only else rng.uniform(0.05, 1.0) * llm
        out.append(SampleWork(f"s{i:03d}", round(enc, 3), round(llm, 3)))
    return out, k


def _pile_up(samples, k) -> float:
    """The paper's largest LLM microbatch over the mean of K: how badly stratification on encoder
    work (and ``K_eff`` from encoder work) piles LLM work up."""
    rep = assign_replica(samples, k)
    return max(rep.llm_work) / (math.fsum(s.llm for s in samples) / k)


def test_llm_dominant_draws_are_hard_for_the_paper():
    seen = []

    @settings(database=None)
    @given(llm_dominant())
    def draw(case):
        seen.append(_pile_up(*case))

    draw()
    assert len(seen) >= 20
    assert np.mean([p > 1.5 for p in seen]) >= 0.5, sorted(seen)


@given(llm_dominant())
def test_llm_dominant_largest_llm_microbatch_never_above_the_papers(case):
    samples, k = case
    mine = assign_replica_two_resource(samples, k)
    paper = assign_replica(samples, k)
    assert max(mine.llm_work) <= max(paper.llm_work) * (1 + 1e-12)


def test_removes_the_papers_pile_up_of_text_only_samples():
    """Text-only samples (zero encoder work) go where the encoder LPT left room: the paper piles all
    six into two microbatches (310 before deferral, 260 after); balancing both resources gets 250."""
    big = [SampleWork(f"big{i}", 10.0, 150.0) for i in range(2)]
    texts = [SampleWork(f"txt{i}", 0.0, 100.0) for i in range(6)]
    small = [SampleWork(f"img{i}", 10.0, 10.0) for i in range(4)]
    paper = assign_replica(big + texts + small, 4)
    piled = sorted(sum(s.startswith("txt") for s in mb) for mb in paper.encoder_microbatches)
    assert piled == [0, 0, 3, 3] and max(paper.llm_work) == 260.0
    mine = assign_replica_two_resource(big + texts + small, 4)
    assert max(mine.llm_work) == 250.0  # the optimum: 150 + 100 in two microbatches


def test_vector_lpt_minimises_the_larger_resource_not_the_sum():
    """A text sample joins the image microbatch (sizes 10 and 6) rather than the text one (10 and
    11), although the latter has the smaller summed load."""
    image, long_text, text = (
        SampleWork("e10", 10.0, 0.0),
        SampleWork("l6", 0.0, 6.0),
        SampleWork("l5", 0.0, 5.0),
    )
    bins = vector_lpt([text, image, long_text], 2, EQUAL_SHARES)
    assert [[s.id for s in b] for b in bins] == [["e10", "l5"], ["l6"]]
