"""``dip``: DIP-like (docs/design.md §2).

* Placement: every rank r of a replica holds encoder chunk r and LLM chunk r (the layout from
  ``planning.baselines.dip_layout``; each modality split by the same min-max layer DP).
* Sub-microbatches: each parent microbatch (the ``dip`` batcher's fixed-size microbatches) is cut,
  in sample order, into encoder subs of at most ``S_enc`` ViT patches and LLM subs of at most
  ``S_llm`` tokens (a larger sample gets a sub of its own). Defaults: 2x the mean per-sample
  counts of DIP's one-microbatch profile (the first parent microbatch of the first iteration);
  the only thing that profile sets. Every sub pays the per-call constant. A raw-work sample counts
  its linear-equivalent tokens (``costs.PlanCosts``).
* Per rank: all encoder forwards (by (mb, sub)), then the LLM chunk's 1F1B over the LLM subs, then
  all encoder backwards (in the order their gradients arrive). Each action starts as soon as its
  inputs exist and the rank is free; encoder activations stay until their backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from entrain.core.costs.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.microbatches import IterationAssignment, ReplicaAssignment
from entrain.core.ir.plan import Action, ActionKind, Layout, MicrobatchSpec, Plan
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.schedules.common import ScheduleOptions, build_plan, one_f_one_b_order
from entrain.core.workload.work import SampleWork

__all__ = ["generate", "cut_by_cap", "dip_caps", "dip_specs", "phase_orders"]

NAME = "dip"


def cut_by_cap(ids: Sequence[str], sizes: Sequence[float], cap: float) -> tuple[tuple[str, ...], ...]:
    """Cut ``ids`` in order into consecutive groups whose ``sizes`` sum to at most ``cap`` (a
    sample larger than ``cap`` forms its own group)."""
    groups: list[list[str]] = []
    total = 0.0
    for sid, size in zip(ids, sizes):
        if groups and total + size <= cap:
            groups[-1].append(sid)
            total += size
        else:
            groups.append([sid])
            total = size
    return tuple(tuple(g) for g in groups)


def dip_caps(
    assignments: Sequence[IterationAssignment], costs: PlanCosts, opts: ScheduleOptions
) -> tuple[float, float]:
    """(S_enc patches, S_llm tokens): the options, or 2x the profile microbatch's mean counts."""
    enc_cap, llm_cap = opts.dip_encoder_cap_patches, opts.dip_llm_cap_tokens
    if enc_cap is None or llm_cap is None:
        rep = assignments[0].replicas[0]
        profile = rep.encoder_microbatches[rep.execution_order[0]][: opts.dip_profile_samples]
        n = max(1, len(profile))
        if enc_cap is None:
            enc_cap = 2.0 * sum(costs.unit_sums("encoder", s)[1] for s in profile) / n
        if llm_cap is None:
            llm_cap = 2.0 * sum(costs.unit_sums("llm", s)[1] for s in profile) / n
    return enc_cap, llm_cap


def dip_specs(costs: PlanCosts, enc_cap: float, llm_cap: float):
    def specs(rep: ReplicaAssignment) -> tuple[MicrobatchSpec, ...]:
        out = []
        for pos, i in enumerate(rep.execution_order):
            enc = rep.encoder_microbatches[i]
            llm = rep.llm_microbatches[i]
            enc_subs = cut_by_cap(enc, [costs.unit_sums("encoder", s)[1] for s in enc], enc_cap)
            llm_subs = cut_by_cap(llm, [costs.unit_sums("llm", s)[1] for s in llm], llm_cap)
            out.append(MicrobatchSpec(pos, i, enc_subs, llm_subs))
        return tuple(out)

    return specs


def _action(graph: ReplicaGraph, kind: ActionKind, stage: int, mb: int, sub: int) -> Action:
    return Action(stage, kind, mb, None if graph.num_subs(stage, mb) == 1 else sub)


def phase_orders(graph: ReplicaGraph) -> dict[int, list[Action]]:
    """Per rank: encoder forwards, LLM 1F1B, encoder backwards (DIP's phase order)."""
    e = graph.num_encoder_stages
    n_llm = graph.num_stages - e
    out: dict[int, list[Action]] = {}
    for rank in sorted({s.pp_rank for s in graph.layout.stages}):
        held = [s.stage for s in graph.layout.stages if s.pp_rank == rank]
        enc = [s for s in held if s < e]
        llm = [s for s in held if s >= e]
        acts = [_action(graph, ActionKind.F, s, m, u) for s in enc for _, m, u in graph.tasks(s)]
        for s in llm:
            tasks = graph.tasks(s)
            fwd = [[_action(graph, ActionKind.F, s, m, u)] for _, m, u in tasks]
            bwd = [[_action(graph, ActionKind.B, s, m, u)] for _, m, u in tasks]
            acts += one_f_one_b_order(fwd, bwd, n_llm - (s - e) - 1)
        for s in sorted(enc, reverse=True):
            tasks = sorted(graph.tasks(s), key=lambda t: (graph.grad_slot(t[1], t[2]), t[1], t[2]))
            acts += [_action(graph, ActionKind.B, s, m, u) for _, m, u in tasks]
        out[rank] = acts
    return out


def generate(
    layout: Layout,
    assignments: Sequence[IterationAssignment],
    samples: dict[str, SampleWork],
    cost: CostModel | None = None,
    options: ScheduleOptions | None = None,
    system: str = NAME,
    order=None,
) -> Plan:
    if cost is None:
        raise ConfigError("dip needs a cost model (sub-microbatch caps)")
    opts = ScheduleOptions.from_any(options)
    costs = PlanCosts(layout, cost, samples)
    enc_cap, llm_cap = dip_caps(assignments, costs, opts)
    opts = replace(opts, dip_encoder_cap_patches=enc_cap, dip_llm_cap_tokens=llm_cap)
    make_order = order(costs) if order is not None else phase_orders
    return build_plan(
        system,
        layout,
        assignments,
        samples,
        dip_specs(costs, enc_cap, llm_cap),
        make_order,
        {"dip_encoder_cap_patches": enc_cap, "dip_llm_cap_tokens": llm_cap},
    )
