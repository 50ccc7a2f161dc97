"""One system end to end in simulation: batcher -> schedule generator -> executor -> metrics.

``run_system`` is what ``entrain simulate`` and ``entrain bench paper`` call per system; the layout
(each system's own configuration) is chosen by the caller (``entrain.core.planning.setups``). Plans come
from ``entrain.core.systems.plan_system`` (re-exported here for compatibility).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from entrain.core.costs.costmodel import CostModel
from entrain.core.ir.microbatches import IterationAssignment
from entrain.core.ir.plan import Layout, Plan
from entrain.core.schedules import ScheduleOptions
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.systems import generate_plan, plan_system, stage_times_fn
from entrain.core.workload.work import SampleWork
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
    replans: list[dict] | None = None
    """``--replan auto``: each re-plan (``entrain.sim.drift.Replan.to_json``)."""
    drift: list[dict] | None = None
    """``--replan auto``: the drift monitor's record per iteration (``IterationDrift.to_json``)."""


def run_system(
    system: str,
    layout: Layout,
    batches: Sequence[Sequence[SampleWork]],
    cost: CostModel,
    options: ScheduleOptions | dict | None = None,
    *,
    trace_iterations: int = 1,
    assignments: Sequence[IterationAssignment] | None = None,
) -> SystemRun:
    """``system`` on ``layout`` over ``batches``, one iteration each; ``assignments``: each batch's
    split into replicas given (the judge's sub-cluster, ``replica_sample``) instead of the batcher's."""
    if assignments is None:
        plan = plan_system(system, layout, batches, cost, options)
    else:
        samples = {s.id: s for batch in batches for s in batch}
        plan = generate_plan(system, layout, assignments, samples, cost, options)
    costs = PlanCosts(layout, cost, plan.samples)
    iterations = simulate_plan(plan, cost, trace_iterations=trace_iterations, costs=costs)
    return SystemRun(
        system, layout, plan, iterations, compute_metrics(layout, iterations, costs, plan.iterations)
    )
