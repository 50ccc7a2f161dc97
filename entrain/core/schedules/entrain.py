"""``entrain``: Entrain's pipeline schedule (paper §5.3, DESIGN.md §1.3).

* Pairwise order: microbatches run in the assignment's ``execution_order`` (ol0, ul0, ol1, ...).
* An encoder microbatch with deferrals runs two forwards back to back in its slot: sub 0 (its
  non-deferred samples), then sub 1 (the deferred ones), each its own call (per-call constant) and
  its own activation message; sub 1 is consumed by the next LLM microbatch.
* Split backward: every encoder stage runs the backward of sub 0 in its own microbatch's slot and
  that of sub 1 in the slot of the partner LLM microbatch that consumed it, when its gradients
  arrive (``common.stage_units``).
* Eager forward: stage ``s`` warms up with as many forwards as fit its activation budget
  ``eager_budget_factor x`` (peak activation bytes of its plain 1F1B order: the warm-up plus the
  deferred sub-microbatches it holds), at least the plain ``p - s - 1``; warm-ups are then made
  non-increasing along the pipeline (stage ``s+1`` never warms up more than stage ``s``), which
  keeps the order deadlock-free. The budget per rank is recorded in ``Plan.options``.
"""

from __future__ import annotations

from collections.abc import Sequence

from entrain.core.assignment.types import IterationAssignment
from entrain.core.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.plan import Action, Layout, Plan
from entrain.core.schedules.common import (
    ScheduleOptions,
    build_plan,
    entrain_specs,
    one_f_one_b_order,
    require_one_stage_per_rank,
    stage_units,
)
from entrain.core.schedules.costs import PlanCosts
from entrain.core.schedules.graph import ReplicaGraph
from entrain.core.work import SampleWork

__all__ = ["generate", "eager_warmups", "peak_bytes"]

NAME = "entrain"


def peak_bytes(fwd_bytes: Sequence[float], bwd_bytes: Sequence[float], warmup: int) -> float:
    """Peak activation bytes of the 1F1B unit order with ``warmup`` forwards (forward unit k
    allocates ``fwd_bytes[k]``, backward slot k frees ``bwd_bytes[k]``)."""
    n = len(fwd_bytes)
    w = max(0, min(warmup, n))
    mem = peak = float(sum(fwd_bytes[:w]))
    for i in range(n - w):
        mem += fwd_bytes[w + i]
        peak = max(peak, mem)
        mem -= bwd_bytes[i]
    return peak


def eager_warmups(graph: ReplicaGraph, costs: PlanCosts, factor: float) -> tuple[list[int], list[float]]:
    """(warm-up forwards per stage, budget bytes per stage) for eager forward."""
    p = graph.num_stages
    warm: list[int] = []
    budgets: list[float] = []
    for stage in range(p):
        fwd, bwd = stage_units(graph, stage)
        fb = [
            sum(costs.activation_bytes(stage, graph.ids(stage, a.mb, a.sub_index)) for a in unit)
            for unit in fwd
        ]
        bb = [
            sum(costs.activation_bytes(stage, graph.ids(stage, a.mb, a.sub_index)) for a in slot)
            for slot in bwd
        ]
        plain = p - stage - 1
        budget = factor * peak_bytes(fb, bb, plain)
        w = plain
        if budget > 0:
            while w < len(fwd) and peak_bytes(fb, bb, w + 1) <= budget:
                w += 1
        if stage > 0:
            w = min(w, warm[-1])
        warm.append(max(w, min(plain, len(fwd))))
        budgets.append(budget)
    return warm, budgets


def _compute_order(costs: PlanCosts | None, factor: float, eager: bool):
    def order(graph: ReplicaGraph) -> dict[int, list[Action]]:
        p = graph.num_stages
        warm = eager_warmups(graph, costs, factor)[0] if eager else [p - s - 1 for s in range(p)]
        out = {}
        for stage in range(p):
            fwd, bwd = stage_units(graph, stage)
            out[graph.rank_of(stage)] = one_f_one_b_order(fwd, bwd, warm[stage])
        return out

    return order


def generate(
    layout: Layout,
    assignments: Sequence[IterationAssignment],
    samples: dict[str, SampleWork],
    cost: CostModel | None = None,
    options: ScheduleOptions | None = None,
    system: str = NAME,
    eager: bool = True,
) -> Plan:
    require_one_stage_per_rank(layout, system)
    opts = ScheduleOptions.from_any(options)
    if eager and cost is None:
        raise ConfigError("entrain's eager forward needs a cost model (activation bytes)")
    costs = PlanCosts(layout, cost, samples) if eager else None
    plan_options = {"eager_budget_factor": opts.eager_budget_factor} if eager else {}
    if opts.ramp_microbatches:
        plan_options.update(ramp_microbatches=opts.ramp_microbatches, ramp_pieces=opts.ramp_pieces)

    def specs(rep):
        return entrain_specs(rep, samples, opts.ramp_microbatches, opts.ramp_pieces)

    order = _compute_order(costs, opts.eager_budget_factor, eager)
    return build_plan(system, layout, assignments, samples, specs, order, plan_options)
