"""``1f1b``: encoder stages then LLM stages on disjoint ranks (one stage per rank), fixed-size
microbatches in the batcher's order, the same samples on encoder and LLM, standard 1F1B
(warm-up ``p - s - 1`` forwards on stage ``s`` of ``p``).

Analytic check (DualPipe README style): with uniform stage times F and B and no communication,
the makespan is ``(m + p - 1) * (F + B)`` for ``m`` microbatches (tested).
"""

from __future__ import annotations

from collections.abc import Sequence

from entrain.core.costs.costmodel import CostModel
from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.microbatches import IterationAssignment
from entrain.core.ir.plan import Action, Layout, Plan
from entrain.core.schedules.common import (
    ScheduleOptions,
    build_plan,
    one_f_one_b_order,
    plain_specs,
    require_one_stage_per_rank,
    stage_units,
)
from entrain.core.workload.work import SampleWork

__all__ = ["generate", "one_f_one_b_compute", "one_f_one_b_makespan"]

NAME = "1f1b"


def one_f_one_b_compute(graph: ReplicaGraph, warmups: Sequence[int] | None = None) -> dict[int, list[Action]]:
    """Per pipeline rank, the 1F1B compute order (``warmups[s]`` overrides stage s's warm-up)."""
    p = graph.num_stages
    out = {}
    for stage in range(p):
        fwd, bwd = stage_units(graph, stage)
        w = p - stage - 1 if warmups is None else warmups[stage]
        out[graph.rank_of(stage)] = one_f_one_b_order(fwd, bwd, w)
    return out


def generate(
    layout: Layout,
    assignments: Sequence[IterationAssignment],
    samples: dict[str, SampleWork],
    cost: CostModel | None = None,
    options: ScheduleOptions | None = None,
    system: str = NAME,
) -> Plan:
    require_one_stage_per_rank(layout, system)
    return build_plan(system, layout, assignments, samples, plain_specs, one_f_one_b_compute, {})


def one_f_one_b_makespan(fwd_ms: Sequence[float], bwd_ms: Sequence[float], num_microbatches: int) -> float:
    """Makespan of 1F1B over stages with per-microbatch times ``fwd_ms[s]``/``bwd_ms[s]`` (every
    microbatch identical, no communication): the longest path through the static orders."""
    p, m = len(fwd_ms), num_microbatches
    if m <= 0 or p == 0:
        return 0.0
    orders = []
    for s in range(p):
        fwd = [[("F", k)] for k in range(m)]
        bwd = [[("B", k)] for k in range(m)]
        orders.append(one_f_one_b_order(fwd, bwd, p - s - 1))
    end: dict[tuple[str, int, int], float] = {}
    ptr, clock = [0] * p, [0.0] * p
    remaining = p * 2 * m
    while remaining:
        progressed = False
        for s in range(p):
            while ptr[s] < len(orders[s]):
                kind, k = orders[s][ptr[s]]
                dep = (
                    ("F", s - 1, k)
                    if kind == "F" and s > 0
                    else ("B", s + 1, k)
                    if kind == "B" and s < p - 1
                    else None
                )
                if dep is not None and dep not in end:
                    break
                start = max(clock[s], end.get(dep, 0.0) if dep else 0.0)
                clock[s] = start + (fwd_ms[s] if kind == "F" else bwd_ms[s])
                end[(kind, s, k)] = clock[s]
                ptr[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - 1F1B never deadlocks
            raise RuntimeError("1F1B recurrence did not progress")
    return max(clock)
