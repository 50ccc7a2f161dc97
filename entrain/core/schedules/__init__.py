"""Schedule generators: one file per system, each ``generate(layout, assignments, samples, cost,
options) -> Plan``; ``generate_plan`` dispatches by system name through ``GENERATORS``.

The generators decide only the per-rank *order* (and the microbatch -> sub-microbatch cut);
which samples form which microbatch comes from the system's batcher (``entrain.core.batching``)
and the layout from the planner (``entrain.core.planner``). Every generator lowers its compute
order into SEND/RECV actions (``lowering.add_comms``); ``entrain.core.validate`` checks the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from entrain.core.assignment.types import IterationAssignment
from entrain.core.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.plan import Layout, Plan
from entrain.core.schedules import (
    dip,
    dip_greedy,
    disttrain,
    disttrain_paper,
    entrain,
    entrain_1f1b,
    one_f_one_b,
)
from entrain.core.schedules.common import ScheduleOptions
from entrain.core.work import SampleWork

__all__ = ["GENERATORS", "generate_plan", "ScheduleOptions"]

Generator = Callable[..., Plan]

GENERATORS: dict[str, Generator] = {
    "entrain": entrain.generate,
    "entrain-1f1b": entrain_1f1b.generate,
    "1f1b": one_f_one_b.generate,
    "disttrain": disttrain.generate,
    "disttrain-paper": disttrain_paper.generate,
    "dip": dip.generate,
    "dip-greedy": dip_greedy.generate,
}


def generate_plan(
    system: str,
    layout: Layout,
    assignments: Sequence[IterationAssignment],
    samples: dict[str, SampleWork],
    cost: CostModel | None = None,
    options: ScheduleOptions | dict | None = None,
) -> Plan:
    """The Plan of ``system`` for these per-iteration assignments (lowered, ready to execute)."""
    try:
        gen = GENERATORS[system]
    except KeyError:
        raise ConfigError(f"unknown system {system!r}; choose from {', '.join(GENERATORS)}") from None
    return gen(layout, list(assignments), samples, cost, ScheduleOptions.from_any(options), system=system)
