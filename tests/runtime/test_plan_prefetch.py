"""Assignment off the critical path: the runtime's Plans computed ahead by a
background process (or thread) are the Plans computed in line (a fresh run, a run resumed mid-way,
the last step), the worker really plans ahead, its failure is the step's error (no hang, also when
the process dies) and ``close`` joins it."""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures.process import BrokenProcessPool

import pytest

from entrain.core.costs.presets import build_cost_model
from entrain.core.errors import ConfigError
from entrain.core.planning.setups import ConfigRequest, fixed_stage_setup
from entrain.core.systems import plan_system
from entrain.data.workload_io import load_workload
from entrain.runtime.plan_prefetch import StepPlanner, StepPlans

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


def _plans(run, mode: str, start: int = 0) -> tuple[list, dict]:
    layout, batches, cost, options = run
    plans = StepPlans(StepPlanner("entrain", layout, cost, options, batches[0]), batches, mode=mode)
    plans.backfill(start)
    try:
        its = [plans.get(s) for s in range(start, STEPS)]
        return its, plans.whole().to_json()
    finally:
        plans.close()


@pytest.mark.parametrize(
    ("mode", "start"), [("process", 0), ("process", 3), ("thread", STEPS - 1), ("ahead", 3)]
)
def test_prefetched_plans_are_the_in_line_plans(run, mode, start):
    layout, batches, cost, options = run
    whole = plan_system("entrain", layout, batches, cost, options)
    ahead, ahead_json = _plans(run, mode, start=start)
    in_line, in_line_json = _plans(run, "inline", start=start)
    assert ahead == in_line == list(whole.iterations[start:])
    assert ahead_json == in_line_json == whole.to_json()  # plan.json of a resumed run is complete too


def test_the_worker_plans_ahead_on_its_own_thread():
    planned = {s: threading.Event() for s in range(4)}
    threads = {}

    def plan(step, batch):
        threads[step] = threading.current_thread().name
        planned[step].set()
        return _Fake(step)

    plans = StepPlans(plan, [[]] * 4, mode="thread")
    try:
        assert plans.get(0).step == 0
        assert planned[2].wait(30)  # steps 1 and 2 are planned without being asked for
        assert not planned[3].is_set()
        assert {threads[s] for s in (0, 1, 2)} != {threading.current_thread().name}
        assert [plans.get(s).step for s in (1, 2, 3)] == [1, 2, 3]
    finally:
        plans.close()


def test_ahead_plans_every_step_in_line_at_the_first_get():
    asked = []

    def plan(step, batch):
        asked.append((step, threading.current_thread().name))
        return _Fake(step)

    plans = StepPlans(plan, [[]] * 4, mode="ahead")
    try:
        assert plans.get(0).step == 0
        assert asked == [(s, threading.current_thread().name) for s in range(4)]  # all, in order, here
        assert [plans.get(s).step for s in (1, 2, 3)] == [1, 2, 3]
        assert len(asked) == 4  # never planned twice
    finally:
        plans.close()


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_worker_failure_is_the_steps_error_and_close_joins(mode):
    plans = StepPlans(_FailingPlanner(), [[]] * 4, mode=mode)
    assert plans.get(1).step == 1  # step 2 already failed on the worker: no error until it is asked for
    with pytest.raises(ConfigError, match="batch 2: sample 'x'"):
        plans.get(2)
    plans.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("entrain-plan")]
    assert not multiprocessing.active_children()


def test_a_dead_worker_process_fails_the_step():
    plans = StepPlans(_DyingPlanner(), [[]] * 4, mode="process")
    with pytest.raises(BrokenProcessPool):
        plans.get(0)
    plans.close()
    assert not multiprocessing.active_children()


class _FailingPlanner:
    def __call__(self, step, batch):
        if step == 2:
            raise ConfigError("batch 2: sample 'x' has no work")
        return _Fake(step)


class _DyingPlanner:
    def __call__(self, step, batch):
        os._exit(7)


class _Fake:
    """A one-iteration 'Plan' whose iteration is its step number."""

    def __init__(self, step: int):
        self.step = step
        self.iterations = (self,)


def _killed_rank(pids) -> None:
    """A 'rank' that starts its planner process, then dies by SIGKILL (no ``close``)."""
    import signal

    plans = StepPlans(_FailingPlanner(), [[]] * 4, mode="process")
    plans.get(0)
    pids.send([p.pid for p in multiprocessing.active_children()])
    os.kill(os.getpid(), signal.SIGKILL)


def test_the_planner_process_leaves_when_its_rank_is_killed():
    import time

    ctx = multiprocessing.get_context("fork")
    pids, child_end = ctx.Pipe(duplex=False)
    rank = ctx.Process(target=_killed_rank, args=(child_end,))
    rank.start()
    assert pids.poll(60)
    planners = pids.recv()
    rank.join(60)
    assert planners and rank.exitcode == -9
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in planners):
        time.sleep(0.2)
    assert not any(_alive(p) for p in planners)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # an exited process not reaped yet is no planner
        return f.read().split()[2] != "Z"
