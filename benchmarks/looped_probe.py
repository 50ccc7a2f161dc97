"""The looped lever, measured: Entrain's batches on the best looped placement of the setup's layers.

``layer_bound.looped_ms`` says that a placement where each pipeline rank holds one run of encoder layers and
one run of LLM layers (DIP's kind of placement) can have a lighter busiest rank than any contiguous split,
Entrain's kind. Whether a schedule turns that into a faster iteration is what this module measures.
``ceiling.py --layers ... --simulate KEY`` runs it on each case it simulates and records it beside Entrain's
own plan.

The probe keeps Entrain's run's DP, TP, microbatch size and count, and pipeline ranks per replica. It
replaces the stages with ``layer_bound.looped_split``'s placement of the layers' work over the case's
batches (their mean). Then Entrain's batcher (``assign_entrain``: the hierarchical assignment with
deferral) runs on that layout. Then the probe runs each schedule the engine has for ranks that hold an
encoder stage and an LLM stage, with every microbatch as one sub-microbatch:

* ``phase``: DIP's phase order (``dip.phase_orders``: every encoder forward, the LLM's 1F1B, every encoder
  backward);
* ``greedy``: DIP's greedy interleaver (``dip_greedy.greedy_orders``);
* ``greedy-mem``: the same within the in-flight window that device memory allows (``dip_greedy.budget_bytes``).

The probe adds no recomputation (Entrain's memory fit recomputes stage chains), no re-split of the DP
assignment, no ramp and no split backward. So it measures the placement under the schedules we have. It is
not an Entrain plan for that placement.
"""

from __future__ import annotations

from dataclasses import replace

import layer_bound

from entrain.core.assignment.hierarchical import assign_entrain
from entrain.core.costs.costmodel import CostModel
from entrain.core.ir.plan import Layout, StageSpec
from entrain.core.schedules import dip
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.schedules.common import ScheduleOptions
from entrain.core.schedules.dip_greedy import budget_bytes, greedy_orders
from entrain.core.systems import stage_times_fn
from entrain.sim.executor import simulate_plan
from entrain.sim.metrics import compute_metrics

ONE_SUB = ScheduleOptions.from_any(
    {"dip_encoder_cap_patches": float("inf"), "dip_llm_cap_tokens": float("inf")}
)
"""DIP's sub-microbatch caps lifted: each of Entrain's microbatches is one sub-microbatch."""


def looped_layout_of(layout: Layout, runs) -> Layout:
    """``layout`` with rank ``r`` holding ``runs[r]``'s (first, end) encoder layers and LLM layers
    (``layer_bound.looped_split``); the encoder's stages first, then the LLM's, each in rank order."""
    stages: list[StageSpec] = []
    for k, comp in enumerate(("encoder", "llm")):
        for r, spans in enumerate(runs):
            first, end = spans[k]
            if end > first:
                stages.append(StageSpec(len(stages), comp, first, end, r))
    count = {c: sum(1 for s in stages if s.component == c) for c in ("encoder", "llm")}
    comps = {c: replace(p, pp=count[c]) for c, p in layout.components.items()}
    return replace(layout, components=comps, stages=tuple(stages))


def _orders(budget: dict[int, float] | None):
    return lambda costs: lambda graph: greedy_orders(graph, costs, budget)


def probe(run, batches, cost: CostModel) -> dict:
    """Entrain's ``run`` (a ``SystemRun`` on ``batches``) against its batches on the best looped placement:
    the placement's busiest-rank figure and, per schedule, the simulated iteration time, whether it fits
    device memory, and its busiest rank's replica-mean busy time."""
    base = run.layout
    tp, n_enc = base.components["llm"].tp, cost.component("encoder").num_layers
    per_batch = [layer_bound.layer_work_ms(b, cost, tp=tp, dp=base.dp) for b in batches]
    work = [sum(col) / len(per_batch) for col in zip(*per_batch)]
    figure_ms, runs = layer_bound.looped_split(work[:n_enc], work[n_enc:], base.ranks_per_replica)
    layout = cost.layout_with_parts(looped_layout_of(base, runs))
    samples = {s.id: s for b in batches for s in b}
    costs = PlanCosts(layout, cost, samples)
    times = stage_times_fn(costs)
    assignments = [
        assign_entrain(list(b), layout.dp, layout.num_microbatches, stage_times=times) for b in batches
    ]
    orders = {"phase": None, "greedy": _orders(None), "greedy-mem": _orders(budget_bytes(costs, ONE_SUB))}
    schedules = {}
    for name, order in orders.items():
        plan = dip.generate(layout, assignments, samples, cost, ONE_SUB, system="dip-greedy", order=order)
        iterations = simulate_plan(plan, cost, trace_iterations=1, costs=costs)
        metrics = compute_metrics(layout, iterations, costs, plan.iterations)
        busiest = sum(max(layer_bound.rank_busy_ms(layout, it)) for it in iterations) / len(iterations)
        schedules[name] = {
            "iteration_time_ms": metrics.iteration_time_ms,
            "fits_memory": metrics.fits_memory,
            "busiest_rank_ms": busiest,
        }
    return {
        "looped_split_ms": figure_ms,
        "runs": [[list(e), list(m)] for e, m in runs],
        "entrain_ms": run.metrics.iteration_time_ms,
        "schedules": schedules,
    }
