"""A system's Plan from global batches: its batcher (``entrain.core.batching``) then its schedule
generator. Both executors (``entrain.sim`` and ``entrain.runtime``) get their Plans from here, so
the runtime never needs the simulator."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from entrain.core.batching import get_batcher
from entrain.core.costmodel import CostModel
from entrain.core.plan import ActionKind, Layout, Plan
from entrain.core.schedules import ScheduleOptions, generate_plan
from entrain.core.schedules.costs import PlanCosts
from entrain.core.work import SampleWork

__all__ = ["plan_system", "stage_times_fn"]


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
    """One iteration per global batch: ``system``'s assignment, then its generator's Plan."""
    samples = {s.id: s for batch in batches for s in batch}
    costs = PlanCosts(layout, cost, samples)
    batcher = get_batcher(system)
    times = stage_times_fn(costs)
    assignments = [batcher(list(b), layout.dp, layout.num_microbatches, stage_times=times) for b in batches]
    return generate_plan(system, layout, assignments, samples, cost, options)
