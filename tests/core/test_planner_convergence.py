"""Algorithm 1 converges: stability is judged on the configuration Algorithm 2 would
deploy (Eq. 2 within a tolerance), the doubling stops at the global batch with ``converged`` False
and a reason, and the one seeded sampler draws with replacement."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.costs.presets import build_cost_model
from entrain.core.costs.sampler import pool_sampler
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.planning.bmin import BMinConfig, DeployCheck, find_b_min
from entrain.core.planning.entry import plan
from entrain.core.workload.work import SampleWork

COST = build_cost_model("qwen25vl-llama3-3b", "a40-flops")
BREAKPOINT = 5.5 / 16
"""Encoder share on the rounding boundary between the 5:11 and 6:10 splits of 16 GPUs."""


def flipping_sampler(offset: float):
    """Every draw's encoder share is ``BREAKPOINT +- offset`` (the sign from the draw's seed) at every
    batch size: the GPU split flips between 6:10 and 5:11 forever, as in the LLaVA example."""

    def sample(n: int, seed: int) -> list[SampleWork]:
        share = BREAKPOINT + (offset if seed % 2 else -offset)
        return [SampleWork(f"s{seed}-{i}", 100.0 * share, 100.0 * (1 - share)) for i in range(n)]

    return sample


def test_split_flip_that_deploys_the_same_stages_converges():
    """TP 2 on 16 GPUs: 5:11 and 6:10 both deploy E.PP 3 / L.PP 5, so the flip does not matter. The
    paper's test never settles (the old planner reported b_min 65536 > the global batch)."""
    res = plan(
        flipping_sampler(0.02), COST, ParallelConfig(gpus=64, dp=4, tp=2, global_batch=512, microbatch_size=4)
    )
    b = res.b_min
    assert b.converged and b.reason is None and b.b_min == 4
    assert b.trial(4).allocations_seen == ((6, 10), (5, 11)) and not b.trial(4).allocation_stable
    assert b.trial(4).eq2_gap <= b.tolerance
    assert (res.config.encoder.pp, res.config.llm.pp) == (3, 5)
    on_64 = ParallelConfig(gpus=64, dp=4, global_batch=512, microbatch_size=4)
    paper = find_b_min(flipping_sampler(0.02), COST, on_64, BMinConfig(max_batch_size=512))
    assert not paper.converged and paper.b_min == 512 and "6:10, 5:11" in paper.reason


def test_split_flip_that_changes_the_deployment_stops_at_the_global_batch():
    """TP 1: 5:11 and 6:10 deploy different stage counts; with tolerance 0 the draws never agree, so
    the search stops at the global batch (48: not a power of two times n0) with a reason."""
    small = ParallelConfig(gpus=16, dp=1, tp=1, global_batch=48, microbatch_size=4)
    res = plan(flipping_sampler(0.02), COST, small, tolerance=0.0)
    b = res.b_min
    assert [t.batch_size for t in b.trials] == [4, 8, 16, 32, 48]
    assert not b.converged and b.b_min == 48 == b.max_batch_size
    assert "global batch" in b.reason and "6:10, 5:11" in b.reason
    assert all(0 < t.eq2_gap < 1 for t in b.trials)
    # a tolerance above the deployments' Eq. 2 difference treats the two splits as the same
    loose = plan(flipping_sampler(0.02), COST, small, tolerance=0.5)
    assert loose.b_min.converged and loose.b_min.b_min == 4


def noisy_sampler(center: float, spread: float):
    def sample(n: int, seed: int) -> list[SampleWork]:
        rng = np.random.default_rng(seed)
        share = np.clip(center + spread * rng.uniform(-1, 1, n), 0.01, 0.99)
        return [SampleWork(f"s{seed}-{i}", 100.0 * s, 100.0 * (1 - s)) for i, s in enumerate(share.tolist())]

    return sample


@settings(max_examples=15)
@given(
    center=st.floats(0.15, 0.85),
    spread=st.floats(0.0, 0.6),
    tp=st.sampled_from([1, 2]),
    global_batch=st.sampled_from([16, 48, 64]),
    tolerance=st.sampled_from([0.0, 0.01]),
)
def test_b_min_never_exceeds_the_global_batch(center, spread, tp, global_batch, tolerance):
    parallel = ParallelConfig(gpus=16, dp=1, tp=tp, global_batch=global_batch, microbatch_size=4)
    bmin = BMinConfig(alpha=0.3, p_error=0.3)
    res = plan(noisy_sampler(center, spread), COST, parallel, bmin, tolerance=tolerance)
    b = res.b_min
    assert b.b_min <= global_batch == b.max_batch_size
    assert b.converged == b.trial(b.b_min).stable and (b.reason is None) == b.converged
    if not b.converged:
        assert b.b_min == global_batch
    path = [t for t in b.trials if t.batch_size < b.b_min]
    assert all(not t.stable for t in path)


def test_deploy_check_rejects_a_bad_tolerance():
    with pytest.raises(Exception, match="tolerance"):
        DeployCheck(ParallelConfig(global_batch=512, microbatch_size=4), tolerance=1.5)


def test_pool_sampler_draws_with_replacement():
    draws = pool_sampler(["a", "b", "c"])(300, 7)
    assert len(draws) == 300 and set(draws) == {"a", "b", "c"}
    small = pool_sampler(list(range(1000)))(200, 3)
    assert len(set(small)) < 200  # repeats (~18 expected) even though the pool is larger than n
    assert pool_sampler(list(range(1000)))(200, 3) == small
