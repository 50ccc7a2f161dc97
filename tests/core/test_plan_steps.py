"""Planning one global batch at a time gives the Plan of planning them all at once (what
lets the runtime plan step N+1 while step N trains): every system, Entrain's automatic choices,
DIP's caps from the first batch, and the memory split recorded on some iterations only."""

from __future__ import annotations

import pytest

from entrain.core.costs.presets import build_cost_model
from entrain.core.planning.setups import ConfigRequest, fixed_stage_setup
from entrain.core.planning.steps import join_plans, pinned_options, plan_step
from entrain.core.systems import SYSTEMS, plan_system
from entrain.data.workload_io import load_workload
from tests.sim.fixtures import raw_samples
from tests.sim.test_memory_split import COST as VIT_COST
from tests.sim.test_memory_split import _layout as vit_layout

MODEL = "qwen25vl-llama3-1b"


def _stepwise(system, layout, batches, cost, options):
    first = plan_step(system, layout, batches[0], cost, options)
    pinned = pinned_options(first)
    return join_plans([first] + [plan_step(system, layout, b, cost, options, pinned) for b in batches[1:]])


@pytest.mark.parametrize("system", list(SYSTEMS))
def test_batch_by_batch_is_the_whole_plan(system):
    cost = build_cost_model(MODEL, "a40-paper")
    batches = [list(b) for b in load_workload("text-heavy", cost, global_batch=32, iterations=3, seed=1)]
    req = ConfigRequest(
        dataset="text-heavy", model=MODEL, gpus=8, dp=2, tp=1, global_batch=32, microbatch_size=2
    )
    setup = fixed_stage_setup(system, req, cost, batches[0], 2, 2)
    whole = plan_system(system, setup.layout, batches, cost, setup.options)
    assert _stepwise(system, setup.layout, batches, cost, setup.options).to_json() == whole.to_json()


def test_memory_split_on_some_iterations_only():
    big = raw_samples({f"b{i}": (w, 3.0) for i, w in enumerate([10, 12, 8, 30, 5, 6, 7, 9])})
    small = raw_samples({f"t{i}": (w, 3.0) for i, w in enumerate([1, 1, 2, 1, 1, 2, 1, 1])})
    batches = [list(small.values()), list(big.values()), list(small.values())]
    options = {"memory_budget_bytes": 150.0}
    whole = plan_system("entrain", vit_layout(), batches, VIT_COST, options)
    assert whole.options["memory_split"]["cuts"][0] == [[]]  # the first batch fits: no cut
    assert _stepwise("entrain", vit_layout(), batches, VIT_COST, options).to_json() == whole.to_json()


def test_dip_caps_from_the_first_batch_hold_for_every_batch():
    """Without caps in the options DIP derives them from the first batch's first microbatch."""
    cost = build_cost_model(MODEL, "a40-paper")
    batches = [list(b) for b in load_workload("text-heavy", cost, global_batch=16, iterations=3, seed=2)]
    req = ConfigRequest(
        dataset="text-heavy", model=MODEL, gpus=4, dp=2, tp=1, global_batch=16, microbatch_size=2
    )
    layout = fixed_stage_setup("dip", req, cost, batches[0], 2, 2).layout
    whole = plan_system("dip", layout, batches, cost, {})
    assert _stepwise("dip", layout, batches, cost, {}).to_json() == whole.to_json()
