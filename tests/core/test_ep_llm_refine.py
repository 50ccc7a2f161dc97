"""``refine_llm_balance``: the replicas of an expert-parallel group run their LLM stages in lockstep, so
each replica's encoder microbatches are refined by swaps that lower its largest LLM microbatch after
deferral, never raising its largest encoder microbatch; its samples and microbatch count stay."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.assignment.hierarchical import assign_replica, refine_llm_balance
from entrain.core.workload.work import SampleWork


def _enc_max(rep, samples) -> float:
    return max(math.fsum(samples[s].encoder for s in mb) for mb in rep.encoder_microbatches)


@settings(deadline=None, max_examples=60)
@given(
    work=st.lists(st.tuples(st.integers(0, 50), st.integers(1, 100)), min_size=4, max_size=24),
    k=st.integers(2, 6),
)
def test_refinement_keeps_samples_and_count_and_lowers_no_bound(work, k):
    batch = [SampleWork(f"s{i:02d}", float(e), float(ll)) for i, (e, ll) in enumerate(work)]
    samples = {s.id: s for s in batch}
    rep = assign_replica(batch, k)
    got = refine_llm_balance(rep, samples)
    assert sorted(got.sample_ids) == sorted(rep.sample_ids) and got.k_eff == rep.k_eff
    assert _enc_max(got, samples) <= _enc_max(rep, samples) + 1e-9
    assert max(got.llm_work) <= max(rep.llm_work)


def test_an_llm_heavy_microbatch_is_rebalanced_within_the_encoder_bound():
    """Algorithm 3's bins (encoder 30 each) leave LLM microbatches 157, 148, 131, 115 after deferral;
    swapping two 10-unit images' samples between the heaviest bin and the lightest gives 148 at most."""
    work = [(20, 92), (20, 55), (20, 86), (10, 39), (10, 76), (10, 65), (10, 76), (10, 62)]
    batch = [SampleWork(f"s{i}", float(e), float(ll)) for i, (e, ll) in enumerate(work)]
    samples = {s.id: s for s in batch}
    rep = assign_replica(batch, 4)
    assert max(rep.llm_work) == 157.0
    got = refine_llm_balance(rep, samples)
    assert max(got.llm_work) == 148.0
    assert _enc_max(got, samples) == _enc_max(rep, samples) == 30.0
