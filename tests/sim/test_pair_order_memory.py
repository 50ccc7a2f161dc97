"""The memory check's paper-pair-order start (``sim.memory_fit.PAPER_PAIRS``): ``pair_order`` ``"auto"``
picks each replica's order of the deferral pairs on a predicted makespan that does not see memory, so an
order it picks can hold more than Algorithm 3's and need recomputation where Algorithm 3's needs none.
Where the planner's plan recomputes, the check also tries Algorithm 3's order, and deploys it where it
simulates faster."""

from __future__ import annotations

import random
from dataclasses import replace

from entrain.core.planning.setups import SystemSetup
from entrain.core.workload.work import SampleWork
from entrain.sim.memory_fit import PAPER_PAIRS, fit_memory_best
from entrain.sim.run import run_system
from tests.sim.fixtures import disjoint_layout, toy_cost

EAGER = {"eager_budget_factor": 1.0}  # no eager start: the order alone decides what a rank holds
AUTO = {**EAGER, "pair_order": "auto"}


def _case():
    """16 samples of three encoder and three LLM sizes on a 2 + 2 pipeline, 8 microbatches; device
    memory 1 % above Algorithm 3's order's peak, which the order ``auto`` picks exceeds."""
    cost = toy_cost(act_bytes_per_token=10.0, out_bytes_per_token=1.0, call_ms=0.1)
    rng = random.Random(14)
    batch = [
        SampleWork(f"s{i:02d}", rng.choice([20.0, 100.0, 400.0]), rng.choice([50.0, 100.0, 300.0]))
        for i in range(16)
    ]
    layout = disjoint_layout(2, 2, k=8)
    paper = run_system("entrain", layout, [batch], cost, EAGER)
    peak = max(paper.metrics.peak_memory_bytes_per_rank)
    tight = replace(cost, hardware=replace(cost.hardware, device_memory_bytes=1.01 * peak))
    return cost, tight, layout, [batch], paper


def test_the_paper_order_is_deployed_where_the_predicted_best_needs_recomputation():
    cost, tight, layout, batches, paper = _case()
    auto = run_system("entrain", layout, batches, cost, AUTO)
    assert auto.plan.options["pair_order_chosen"] != [["paper"]]
    assert auto.metrics.iteration_time_ms < paper.metrics.iteration_time_ms  # faster with room
    assert max(auto.metrics.peak_memory_bytes_per_rank) > tight.hardware.device_memory_bytes  # holds more

    got, run = fit_memory_best("entrain", SystemSetup(layout, dict(AUTO), ""), batches, tight)
    d = got.decisions[-1]
    assert d.chosen == PAPER_PAIRS and d.candidates[PAPER_PAIRS] < d.candidates["planner"], d.candidates
    assert got.options["pair_order"] == "paper" and "paper's pair order" in got.source
    assert run.metrics.fits_memory is True and all(st.recompute == "none" for st in run.layout.stages)
    assert run.metrics.iteration_time_ms == paper.metrics.iteration_time_ms


def test_no_paper_order_start_without_recomputation_or_without_auto():
    cost, tight, layout, batches, _ = _case()
    got, _ = fit_memory_best("entrain", SystemSetup(layout, dict(AUTO), ""), batches, cost)
    assert list(got.decisions[-1].candidates) == ["planner"]  # nothing recomputed: nothing to try
    got, _ = fit_memory_best("entrain", SystemSetup(layout, dict(EAGER), ""), batches, tight)
    assert PAPER_PAIRS not in got.decisions[-1].candidates  # the paper's order already
