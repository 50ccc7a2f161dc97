"""``disttrain``: DistTrain-like. The schedule is plain 1F1B on disjoint encoder and LLM ranks;
what differs from ``1f1b`` is upstream (DESIGN.md §2): the config comes from Algorithm 2 on one
profiled sample (``planner.disttrain_profile_sample``), and the ``disttrain`` batcher gives each
replica exactly U samples of every global microbatch by LPT on encoder cost, then reorders whole
microbatches by greedy insertion minimising the analytic 1F1B makespan (the assignment's
``execution_order``, which this generator follows)."""

from __future__ import annotations

from collections.abc import Sequence

from entrain.core.assignment.types import IterationAssignment
from entrain.core.costmodel import CostModel
from entrain.core.plan import Layout, Plan
from entrain.core.schedules import one_f_one_b
from entrain.core.schedules.common import ScheduleOptions
from entrain.core.work import SampleWork

__all__ = ["generate"]

NAME = "disttrain"


def generate(
    layout: Layout,
    assignments: Sequence[IterationAssignment],
    samples: dict[str, SampleWork],
    cost: CostModel | None = None,
    options: ScheduleOptions | None = None,
    system: str = NAME,
) -> Plan:
    return one_f_one_b.generate(layout, assignments, samples, cost, options, system=system)
