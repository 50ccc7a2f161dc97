"""Schedule generators: one file per system, each ``generate(layout, assignments, samples, cost,
options) -> Plan``; ``entrain.core.systems`` maps system names to them (``generate_plan``).

The generators decide only the per-rank *order* (and the microbatch -> sub-microbatch cut);
which samples form which microbatch comes from the system's batcher (``entrain.core.batching``)
and the layout from the planner (``entrain.core.planner``). Every generator lowers its compute
order into SEND/RECV actions (``lowering.add_comms``); ``entrain.core.validate`` checks the result.
"""

from __future__ import annotations

from entrain.core.schedules.common import ScheduleOptions

__all__ = ["ScheduleOptions"]
