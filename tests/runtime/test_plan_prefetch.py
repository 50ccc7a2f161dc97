"""Assignment off the critical path (issue 25 req. 2): the runtime's Plans computed ahead on a worker
thread are the Plans computed in line (a fresh run, a run resumed mid-way, the last step), the
worker really plans ahead, its failure is the step's error (no hang) and ``close`` joins it."""

from __future__ import annotations

import threading

import pytest

from entrain.core.errors import ConfigError
from entrain.core.presets import build_cost_model
from entrain.core.setups import ConfigRequest, fixed_stage_setup
from entrain.core.systems import plan_system
from entrain.data.workload_io import load_workload
from entrain.runtime.plan_prefetch import StepPlans, step_planner

STEPS = 5


@pytest.fixture(scope="module")
def run():
    cost = build_cost_model("qwen25vl-llama3-1b", "a40-paper")
    batches = [list(b) for b in load_workload("skewed", cost, global_batch=16, iterations=STEPS, seed=4)]
    req = ConfigRequest(
        dataset="skewed", model="qwen25vl-llama3-1b", gpus=4, dp=1, tp=1, global_batch=16, microbatch_size=2
    )
    setup = fixed_stage_setup("entrain", req, cost, batches[0], 2, 2)
    return setup.layout, batches, cost, setup.options


def _plans(run, background: bool, start: int = 0) -> tuple[list, dict]:
    layout, batches, cost, options = run
    plans = StepPlans(step_planner("entrain", layout, batches, cost, options), STEPS, background=background)
    plans.backfill(start)
    try:
        its = [plans.get(s) for s in range(start, STEPS)]
        return its, plans.whole().to_json()
    finally:
        plans.close()


@pytest.mark.parametrize("start", [0, 3, STEPS - 1])
def test_prefetched_plans_are_the_in_line_plans(run, start):
    layout, batches, cost, options = run
    whole = plan_system("entrain", layout, batches, cost, options)
    ahead, ahead_json = _plans(run, background=True, start=start)
    in_line, in_line_json = _plans(run, background=False, start=start)
    assert ahead == in_line == list(whole.iterations[start:])
    assert ahead_json == in_line_json == whole.to_json()  # plan.json of a resumed run is complete too


def test_the_worker_plans_ahead_on_its_own_thread():
    planned = {s: threading.Event() for s in range(4)}
    threads = {}

    def plan(step):
        threads[step] = threading.current_thread().name
        planned[step].set()
        return _Fake(step)

    plans = StepPlans(plan, 4)
    try:
        assert plans.get(0).step == 0
        assert planned[2].wait(30)  # steps 1 and 2 are planned without being asked for
        assert not planned[3].is_set()
        assert {threads[s] for s in (0, 1, 2)} != {threading.current_thread().name}
        assert [plans.get(s).step for s in (1, 2, 3)] == [1, 2, 3]
    finally:
        plans.close()


def test_a_worker_failure_is_the_steps_error_and_close_joins():
    def plan(step):
        if step == 2:
            raise ConfigError("batch 2: sample 'x' has no work")
        return _Fake(step)

    plans = StepPlans(plan, 4)
    assert plans.get(1).step == 1  # step 2 already failed on the worker: no error until it is asked for
    with pytest.raises(ConfigError, match="batch 2: sample 'x'"):
        plans.get(2)
    plans.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("entrain-plan")]


class _Fake:
    """A one-iteration 'Plan' whose iteration is its step number."""

    def __init__(self, step: int):
        self.step = step
        self.iterations = (self,)
