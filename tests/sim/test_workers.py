"""Worker processes for the planner's per-replica work (``entrain.core.workers``):
with ``--jobs 2`` Entrain's per-replica candidates and the executor's replicas run in forked workers,
and the plan, its options and every simulated number are bitwise those of the serial loop."""

from __future__ import annotations

from dataclasses import replace

import pytest

from entrain.core.workers import ordered_map, worker_processes
from entrain.sim.choose import judged_ms
from entrain.sim.run import run_system
from tests.sim.test_replica_sample import _at


def _fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    return x * x


def test_ordered_map_keeps_the_order_and_raises_the_error():
    with worker_processes(2):
        assert ordered_map(lambda x: (x, x * 0.1), range(9)) == [(x, x * 0.1) for x in range(9)]
        with pytest.raises(ValueError, match="three"):
            ordered_map(_fail_on_three, range(6))
    assert ordered_map(_fail_on_three, [1, 2]) == [1, 4]  # outside the block: the plain loop


OPTIONS = {
    "split_weight_grads": True,
    "ramp_microbatches": "auto",
    "assignment": "auto",
    "memory_split": True,
}


def test_two_workers_give_the_serial_plan_and_simulation_bit_for_bit():
    """Entrain with every per-replica choice (ramp, assignment, DP re-split) on 8
    replicas: the same Plan (assignments, orders, chosen options) and the same runs and metrics."""
    cost, setup, draws = _at(8, 4)
    layout = replace(setup.layout, dp=8)
    runs = {}
    for jobs in (1, 2):
        with worker_processes(jobs):
            runs[jobs] = run_system("entrain", layout, draws, cost, OPTIONS, trace_iterations=1)
    serial, pooled = runs[1], runs[2]
    assert pooled.plan == serial.plan
    assert pooled.plan.options == serial.plan.options
    assert serial.plan.options["dp_split_chosen"] == ["two-resource"]
    assert {tuple(r) for r in serial.plan.options["ramp_chosen"][0]} == {(7, 2), (7, 3)}  # per replica
    assert pooled.iterations == serial.iterations
    assert pooled.metrics == serial.metrics


def test_the_judges_dp_split_is_reused_for_the_same_layout_only():
    """The judge keeps each layout's heaviest replicas (``judged_ms``'s ``splits``): candidates that
    differ in options only share them, another layout gets its own, and the times are those of
    judging every candidate afresh."""
    cost, setup, draws = _at(64, 2)
    other = replace(setup, layout=replace(setup.layout, dp=32, num_microbatches=4))  # same 512 samples
    cands = [setup, replace(setup, options={"split_weight_grads": True}), other]
    splits: dict = {}
    kept = [judged_ms(s, draws, cost, 16, splits=splits)[0] for s in cands]
    assert len(splits) == 2
    assert kept == [judged_ms(s, draws, cost, 16)[0] for s in cands]
