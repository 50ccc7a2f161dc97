"""One system end to end in simulation: batcher -> schedule generator -> executor -> metrics.

``run_system`` is what ``entrain simulate`` and ``entrain bench paper`` call per system; the layout
(each system's own configuration) is chosen by the caller (``entrain.sim.systems``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from entrain.core.batching import get_batcher
from entrain.core.costmodel import CostModel
from entrain.core.plan import ActionKind, Layout, Plan
from entrain.core.schedules import ScheduleOptions, generate_plan
from entrain.core.schedules.costs import PlanCosts
from entrain.core.work import SampleWork
from entrain.sim.executor import IterationRun, simulate_plan
from entrain.sim.metrics import SystemMetrics, compute_metrics

__all__ = ["SystemRun", "run_system", "stage_times_fn", "plan_system"]


@dataclass
class SystemRun:
    system: str
    layout: Layout
    plan: Plan
    iterations: list[IterationRun]
    metrics: SystemMetrics


def stage_times_fn(costs: PlanCosts):
    """For the DistTrain batcher: a microbatch's samples -> ``(2, S)`` forward/backward ms per
    stage of ``costs.layout`` (one call each, per-call constants included)."""

    def times(samples: Sequence[SampleWork]) -> np.ndarray:
        ids = [s.id for s in samples]
        n = len(costs.layout.stages)
        fwd = [costs.compute_ms(s, ActionKind.F, ids) for s in range(n)]
        bwd = [costs.compute_ms(s, ActionKind.B, ids) for s in range(n)]
        return np.array([fwd, bwd])

    return times


def plan_system(
    system: str,
    layout: Layout,
    batches: Sequence[Sequence[SampleWork]],
    cost: CostModel,
    options: ScheduleOptions | dict | None = None,
) -> Plan:
    samples = {s.id: s for batch in batches for s in batch}
    costs = PlanCosts(layout, cost, samples)
    batcher = get_batcher(system)
    times = stage_times_fn(costs)
    assignments = [batcher(list(b), layout.dp, layout.num_microbatches, stage_times=times) for b in batches]
    return generate_plan(system, layout, assignments, samples, cost, options)


def run_system(
    system: str,
    layout: Layout,
    batches: Sequence[Sequence[SampleWork]],
    cost: CostModel,
    options: ScheduleOptions | dict | None = None,
    *,
    trace_iterations: int = 1,
) -> SystemRun:
    plan = plan_system(system, layout, batches, cost, options)
    iterations = simulate_plan(plan, cost, trace_iterations=trace_iterations)
    return SystemRun(system, layout, plan, iterations, compute_metrics(layout, iterations))
