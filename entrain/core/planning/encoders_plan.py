"""Entrain's Plan for a model with several encoders (docs/design.md, "N encoders"): the configuration
``planning.encoders.search_encoders`` deploys, each global batch assigned by
``assignment.multi_encoder``, each replica run as 1F1B with deferral over every encoder pipeline.

* Layout (``encoders_layout``): each encoder's stages (named by ``StageSpec.encoder``, encoders in
  order), then the LLM's, one stage per pipeline rank; ``Layout.components`` holds each encoder's
  degrees under its name and the LLM's under ``llm``.
* Assignment: ``assign_multi_encoder`` with encoder ``e``'s weight one over its group's GPUs (the time
  its work takes there), as many microbatches a replica as ``MultiEncoderConfig.microbatch_count`` says
  (``K_eff`` on the bottleneck encoder, or the requested count: ``below_requested`` tells where they
  differ, ``sim.encoders_run.fit_entrain`` picks by simulation); encoder microbatch ``i`` is the same samples on every encoder pipeline, and
  deferral moves LLM work only (its samples' outputs of every encoder wait on the first LLM stage).
* Order (``encoders_compute``): per stage the 1F1B unit order of ``common.stage_units`` (a deferred
  encoder sub runs its backward in the slot of the LLM microbatch that consumed it) with the warm-up
  of its depth: the stages after it on its way to the last (an encoder stage's own pipeline's, then
  the LLM's), not the stage count, since the encoder pipelines run side by side.
* Samples carry each encoder's work (``SampleWork.encoders``) and their token metadata; the plan is
  priced by ``schedules.encoder_costs.EncodersPlanCosts``.

Not built yet: the eager forward, the ramp and memory split of the one-encoder generator, message
parts (``StageSpec.parts``), several stages per rank, recomputation choices beyond the search's.
"""

from __future__ import annotations

from collections.abc import Sequence

from entrain.core.assignment.multi_encoder import EncoderWork, assign_multi_encoder
from entrain.core.errors import ConfigError
from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.microbatches import IterationAssignment
from entrain.core.ir.plan import Action, ComponentLayout, Layout, Plan, StageSpec
from entrain.core.planning.config_search import ComponentConfig
from entrain.core.planning.encoders import Encoder, MultiEncoderConfig, encoder_works
from entrain.core.schedules import entrain
from entrain.core.schedules.common import build_plan, entrain_specs, one_f_one_b_order, stage_units
from entrain.core.workload.work import SampleWork

__all__ = [
    "encoders_layout",
    "encoders_config",
    "encoders_options",
    "encoders_compute",
    "encoder_weights",
    "generate_encoders_plan",
    "below_requested",
]

SYSTEM = entrain.NAME


def encoders_layout(cfg: MultiEncoderConfig) -> Layout:
    """Each encoder's stages, then the LLM's, one per pipeline rank (module docstring)."""
    stages: list[StageSpec] = []
    for comp in (*cfg.encoders, cfg.llm):
        enc = None if comp is cfg.llm else comp.name
        kind = "llm" if comp is cfg.llm else "encoder"
        for j, (first, end) in enumerate(comp.layer_ranges):
            s = len(stages)
            stages.append(StageSpec(s, kind, first, end, s, comp.stage_recompute(j), encoder=enc))
    comps = {c.name: ComponentLayout(c.tp, c.cp, c.pp) for c in cfg.encoders}
    comps["llm"] = ComponentLayout(cfg.llm.tp, cfg.llm.cp, cfg.llm.pp)
    return Layout(cfg.dp, cfg.microbatch_size, cfg.num_microbatches, comps, tuple(stages))


def encoders_config(layout: Layout, microbatch_count: str = "paper") -> MultiEncoderConfig:
    """The configuration whose ``encoders_layout`` is ``layout`` (one pipeline per encoder, one stage
    per pipeline rank: a plan file's), with the microbatch count ``microbatch_count``: what the plans
    of ``generate_encoders_plan`` and DistTrain-like's read of it (degrees, stages, recomputation, each
    encoder's GPUs). The search's numbers (stage times, memory, Eq. 2) are not in a layout: zero."""

    def component(name: str, kind: str, key: str) -> ComponentConfig:
        stages = [s for s in layout.stages if s.component == kind and s.component_key == key]
        par = layout.components[key]
        ranges = tuple((s.first_layer, s.end_layer) for s in stages)
        zeros = (0.0,) * len(stages)
        recompute = tuple(s.recompute for s in stages)
        return ComponentConfig(name, par.tp, par.cp, par.pp, (), ranges, zeros, zeros, recompute)

    encoders = tuple(component(n, "encoder", n) for n in layout.encoder_names)
    llm = component("llm", "llm", "llm")
    alloc = tuple(c.gpus for c in (*encoders, llm))
    return MultiEncoderConfig(
        layout.dp, layout.microbatch_size, layout.num_microbatches, sum(alloc), alloc, encoders, llm, 0.0,
        True, microbatch_count,
    )  # fmt: skip


def encoders_options(cfg: MultiEncoderConfig) -> dict:
    """The schedule options of ``cfg``'s plans: its microbatch count where it is not the paper's."""
    return {} if cfg.microbatch_count == "paper" else {"microbatch_count": cfg.microbatch_count}


def _depth(layout: Layout, stage: int) -> int:
    n, s = 0, layout.next_stage(stage)
    while s is not None:
        n, s = n + 1, layout.next_stage(s)
    return n


def encoders_compute(graph: ReplicaGraph) -> dict[int, list[Action]]:
    """Per pipeline rank (one stage each), the 1F1B order with the warm-up of the stage's depth."""
    out = {}
    for stage in range(graph.num_stages):
        fwd, bwd = stage_units(graph, stage)
        out[graph.rank_of(stage)] = one_f_one_b_order(fwd, bwd, _depth(graph.layout, stage))
    return out


def encoder_weights(cfg: MultiEncoderConfig) -> tuple[float, ...]:
    """Encoder ``e``'s weight in the assignment: one over its group's GPUs."""
    return tuple(1.0 / c.gpus for c in cfg.encoders)


def generate_encoders_plan(
    batches: Sequence[Sequence],
    encoders: Sequence[Encoder],
    cfg: MultiEncoderConfig,
    *,
    system: str = SYSTEM,
) -> Plan:
    """One iteration per global batch (samples with token metadata: ``SampleMeta`` or a ``SampleWork``
    with ``meta``), on ``cfg`` (``search_encoders``' best, say)."""
    if [e.name for e in encoders] != [c.name for c in cfg.encoders]:
        raise ConfigError(
            f"encoders {[e.name for e in encoders]} do not match the configuration's "
            f"{[c.name for c in cfg.encoders]}"
        )
    layout = encoders_layout(cfg)
    weights = encoder_weights(cfg)
    assignments, samples = [], {}
    for batch in batches:
        works: list[EncoderWork] = encoder_works(batch, encoders)
        for w in works:
            samples[w.id] = SampleWork(w.id, w.encoder, w.llm, w.meta, w.encoders)
        reps = assign_multi_encoder(works, cfg.dp, cfg.num_microbatches, weights, rule=cfg.microbatch_count)
        assignments.append(IterationAssignment(tuple(r.replica for r in reps)))
    return build_plan(
        system, layout, assignments, samples, entrain_specs, encoders_compute, encoders_options(cfg)
    )


def below_requested(plan: Plan) -> bool:
    """Whether some replica of ``plan`` has fewer encoder microbatches than the requested count allows it
    (``K_eff`` on the bottleneck encoder below ``min(K, its samples)``): where the requested count
    (``MultiEncoderConfig.microbatch_count`` ``"requested"``) gives another plan."""
    k = plan.layout.num_microbatches
    reps = (rep for it in plan.iterations for rep in it.assignment.replicas)
    return any(rep.k_eff < min(k, len(rep.sample_ids)) for rep in reps)
