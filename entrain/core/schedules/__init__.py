"""Schedule generators: one file per schedule, each a ``common.PlanGenerator``
(``generate(layout, assignments, samples, cost, options, system=...) -> Plan``);
``entrain.core.systems`` maps system names to them (``generate_plan``): ``disttrain`` and
``disttrain-paper`` run ``one_f_one_b``'s, ``entrain-1f1b`` runs ``entrain``'s without the eager forward.

The generators decide only the per-rank *order* (and the microbatch -> sub-microbatch cut);
which samples form which microbatch comes from the system's batcher (``entrain.core.assignment.batchers``)
and the layout from the planner (``entrain.core.planning``). Every generator lowers its compute
order into SEND/RECV actions (``lowering.add_comms``); ``entrain.core.ir.validate`` checks the result.
"""

from __future__ import annotations

from entrain.core.schedules.common import ScheduleOptions

__all__ = ["ScheduleOptions"]
