"""``disttrain-paper``: DistTrain's schedule and batching (``disttrain``) under the paper's own
Table 1 DistTrain configuration (``planner.paper_table1_config``) instead of our one-sample
Algorithm 2 pick."""

from __future__ import annotations

from collections.abc import Sequence

from entrain.core.assignment.types import IterationAssignment
from entrain.core.costmodel import CostModel
from entrain.core.plan import Layout, Plan
from entrain.core.schedules import disttrain
from entrain.core.schedules.common import ScheduleOptions
from entrain.core.work import SampleWork

__all__ = ["generate"]

NAME = "disttrain-paper"


def generate(
    layout: Layout,
    assignments: Sequence[IterationAssignment],
    samples: dict[str, SampleWork],
    cost: CostModel | None = None,
    options: ScheduleOptions | None = None,
    system: str = NAME,
) -> Plan:
    return disttrain.generate(layout, assignments, samples, cost, options, system=system)
