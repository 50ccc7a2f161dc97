"""The decisions' judge at large DP: above ``JUDGE_REPLICAS`` replicas it simulates
the heaviest replicas of each draw's DP split as a sub-cluster (``entrain.sim.replica_sample``). Here
the estimate against the full simulation at DP 8, 16 and 64 (the fast path engaged directly, with
fewer replicas), and the decisions it gives against the full judge's."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest

from entrain.core.costs.presets import resolve_cost_model
from entrain.core.planning.setups import DECISION_MARGIN, ConfigRequest, pick, system_setups
from entrain.data.sampling import dataset_sampler
from entrain.sim.choose import judged_ms, planner_draws

HEADLINE = ConfigRequest("synthchartnet", "qwen25vl-llama3-1b", 64, 4, 2, 512, 4, seed=3)


@cache
def _base():
    cost = resolve_cost_model(HEADLINE.model, hardware="a40-paper")
    sampler = dataset_sampler(HEADLINE.dataset, HEADLINE.seed)
    paper = replace(HEADLINE, entrain_layout="disjoint", entrain_ramp=0, entrain_split=False,
                    entrain_assignment="paper")  # fmt: skip
    return cost, sampler, system_setups(["entrain"], paper, cost, sampler)["entrain"]


@cache
def _at(dp: int, microbatches: int):
    """(cost, setup, one planner draw) of the headline's layout on ``dp`` replicas."""
    cost, sampler, base = _base()
    layout = replace(base.layout, dp=dp, num_microbatches=microbatches)
    req = replace(HEADLINE, dp=dp, global_batch=layout.global_batch)
    return cost, replace(base, layout=layout), planner_draws(sampler, cost, req, num_draws=1)


CANDIDATES = {
    "plain": {},
    "split": {"split_weight_grads": True},
    "ramp": {"split_weight_grads": True, "ramp_microbatches": 3},
    "two-resource": {"split_weight_grads": True, "assignment": "two-resource", "dp_resplit": False},
}


ERROR = {8: 0.03, 16: 0.001, 64: 1e-9}
"""Measured relative error of the estimate (heaviest quarter of the replicas) against the full
simulation: exact at DP 64 and for three candidates at DP 16 (the two-resource assignment 0.03 %
low: its shares are priced over the sub-cluster's samples); at DP 8, with 4 microbatches of 4 samples a replica, the slowest
replica (a lumpy one, 2449 vs 2384 ms) is one of the two lightest by load, and the estimate is 1.5-2.6 %
low (the margin of the decisions below is far larger)."""


@pytest.mark.parametrize("dp, replicas, microbatches", [(8, 2, 4), (16, 4, 4), (64, 16, 2)])
def test_heaviest_replicas_give_the_full_simulation_and_its_decision(dp, replicas, microbatches):
    """The judge's estimate from the heaviest replicas against the full simulation (``ERROR``), and
    the same decision among the candidates (the fastest past the margin)."""
    cost, setup, draws = _at(dp, microbatches)
    names = list(CANDIDATES) if dp < 64 else ["plain", "split"]
    full, fast = {}, {}
    for name in names:
        s = replace(setup, options=CANDIDATES[name])
        full[name] = judged_ms(s, draws, cost, dp)[0]
        fast[name] = judged_ms(s, draws, cost, replicas)[0]
    print(dp, replicas, {n: (round(full[n], 1), round(fast[n] / full[n] - 1, 5)) for n in names})
    assert all(
        fast[n] <= full[n] * (1 + 1e-12) for n in names
    )  # a sub-cluster's slowest is a replica of the full one
    assert fast == pytest.approx(full, rel=ERROR[dp])
    assert (
        pick("d", "plain", fast, DECISION_MARGIN).chosen == pick("d", "plain", full, DECISION_MARGIN).chosen
    )
