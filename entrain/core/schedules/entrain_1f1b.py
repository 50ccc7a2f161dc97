"""``entrain-1f1b``: Entrain's assignment, sub-microbatches and split backward with the plain
1F1B warm-up (``p - s - 1`` forwards): the eager-forward ablation."""

from __future__ import annotations

from collections.abc import Sequence

from entrain.core.assignment.types import IterationAssignment
from entrain.core.costmodel import CostModel
from entrain.core.plan import Layout, Plan
from entrain.core.schedules import entrain
from entrain.core.schedules.common import ScheduleOptions
from entrain.core.work import SampleWork

__all__ = ["generate"]

NAME = "entrain-1f1b"


def generate(
    layout: Layout,
    assignments: Sequence[IterationAssignment],
    samples: dict[str, SampleWork],
    cost: CostModel | None = None,
    options: ScheduleOptions | None = None,
    system: str = NAME,
) -> Plan:
    return entrain.generate(layout, assignments, samples, cost, options, system=system, eager=False)
