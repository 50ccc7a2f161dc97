"""Baselines with several encoders, each in its own way (docs/design.md, "N encoders").

* **DistTrain-like** (``generate_disttrain_encoders_plan``): one parallel group per encoder (its
  disaggregated modules), the degrees from the N-way search (``search_encoders``) on its one profiled
  sample (``disttrain_encoders_sample``: the lower median of the summed encoder work : LLM work ratio,
  stable on (ratio, id)); each global batch by its batcher (``assign_disttrain``: data-order global
  microbatches dealt to replicas longest-first on the *summed* encoder cost, then the greedy
  reordering), whose analytic 1F1B makespan sees one chain of stages: the batch's bottleneck encoder
  pipeline (the largest summed stage time over the batch; ties: the first) then the LLM's
  (``bottleneck_chain``); run as 1F1B at each stage's depth (``encoders_plan.encoders_compute``).
* **1F1B**: both towers in the first (encoder) stages as one encoder component whose work is both
  towers', which is the one-encoder path as the Omni family plans today (the audio tower's layers on
  the first encoder layer price a clip's rows, ``CostModel.units``): nothing here.
* **DIP-like, as published** (``generate_dip_encoders_plan``; ``dip`` and ``dip-greedy``). DIP
  (ASPLOS'26, arXiv 2504.14145; reference notes, "DIP", Mechanism) handles several modalities by
  *modality-aware partitioning*: every modality module gets its own pipeline segments, interleaved
  over the same devices, and each batch is cut into *modality-specific sub-microbatches* inside the
  parent microbatch, which the per-rank scheduler interleaves. What we build, following that section:

  - placement (``dip_encoders_layout``): pipeline rank ``r`` of a replica holds chunk ``r`` of every
    encoder and of the LLM (one segment per modality per rank, as the one-encoder ``dip_layout``),
    each modality cut over the ``P`` ranks by Algorithm 2's min-max partition of its own mean
    per-layer times (its own units) on DIP's 4-sample profile; DP / TP / CP fixed up front as the
    one-encoder DIP's (``dip_encoders_parallel``);
  - parent microbatches: the ``dip`` batcher's (fixed size, data order);
  - sub-microbatches: each encoder under its own cap (``dip_encoders_caps``: twice the profile's mean
    per-sample units: vision patches and frames, audio rows), the LLM under its token cap;
  - schedule: ``dip`` the phase order Entrain's paper observed of DIP (per rank every encoder chunk's
    forwards, chunk by chunk, then the LLM chunk's 1F1B, then the encoder backwards as their
    gradients arrive: ``schedules.dip.phase_orders``); ``dip-greedy`` DIP's greedy dual-queue
    interleaver over that queue (``schedules.dip_greedy.greedy_orders``), timed by the plan's
    ``EncodersPlanCosts`` as DIP's planner uses its emulator.

  Differences from the paper: (1) the Plan IR gives an encoder microbatch's subs to every encoder
  pipeline alike, so the encoders' caps cut *one* sequence of encoder subs (``cut_by_caps``: a sample
  opens a new sub when any encoder's running total would pass its cap), not one per modality; an
  encoder absent from the profile (mean 0) cuts nothing; (2) one segment per modality per rank, not
  ``K_i`` segments in proportion to measured latency; (3) the segment order is not searched (no MCTS)
  and there is no per-rank memory ILP (``dip-greedy-mem`` is not built here); (4) DIP's 4-sample
  profile is the first four samples of the planner's reference draw (the caller's ``profile``), not a
  draw of its own; (5) the caps are twice the profile's means, not the smallest size keeping 95 % of
  peak efficiency (as the one-encoder ``dip``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from entrain.core.assignment.batchers.dip import assign_dip
from entrain.core.assignment.batchers.disttrain import assign_disttrain
from entrain.core.errors import ConfigError
from entrain.core.ir.microbatches import ReplicaAssignment
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.ir.plan import ActionKind, ComponentLayout, Layout, MicrobatchSpec, Plan, StageSpec
from entrain.core.planning.baselines import dip_dp
from entrain.core.planning.config_search import evaluate_config, gpus_of
from entrain.core.planning.encoders import (
    Encoder,
    MultiEncoderConfig,
    encoder_stats,
    encoder_works,
    search_encoders,
)
from entrain.core.planning.encoders_plan import encoders_compute, encoders_layout, generate_encoders_plan
from entrain.core.schedules import dip, dip_greedy
from entrain.core.schedules.common import build_plan, plain_specs
from entrain.core.schedules.encoder_costs import EncodersPlanCosts
from entrain.core.systems import DIP, DIP_GREEDY, DISTTRAIN, ENTRAIN, ONE_F_ONE_B
from entrain.core.workload.work import SampleWork

__all__ = [
    "ENCODERS_SYSTEMS",
    "CONFIG_SYSTEMS",
    "DIP_PROFILE_SAMPLES",
    "disttrain_encoders_sample",
    "disttrain_encoders_config",
    "bottleneck_chain",
    "generate_disttrain_encoders_plan",
    "dip_encoders_parallel",
    "dip_encoders_layout",
    "dip_encoders_caps",
    "cut_by_caps",
    "generate_dip_encoders_plan",
    "generate_config_plan",
    "plan_encoders_system",
]

ENCODERS_SYSTEMS = (ENTRAIN, DISTTRAIN, DIP, DIP_GREEDY)
"""The systems with a plan of one pipeline (or one segment per rank) per encoder
(``plan_encoders_system``); every other refuses in one line."""
CONFIG_SYSTEMS = (ENTRAIN, DISTTRAIN)
"""Those whose plan comes from a searched ``MultiEncoderConfig`` (``generate_config_plan``): what
``entrain train`` runs with one pipeline per encoder tower."""
DIP_PROFILE_SAMPLES = 4
"""DIP profiles one microbatch of 4 samples (paper Table 1)."""


def disttrain_encoders_sample(samples: Sequence, encoders: Sequence[Encoder]):
    """DistTrain's one profiled sample with several encoders: the lower median of the summed encoder
    work : LLM work ratio (stable sort on (ratio, id)); its ``SampleMeta``."""
    works = encoder_works(samples, encoders)
    if not works:
        raise ConfigError("DistTrain profiles one sample of the draw: the draw is empty")
    order = sorted(works, key=lambda w: (w.encoder / max(w.llm, 1e-300), w.id))
    return order[(len(order) - 1) // 2].meta


def disttrain_encoders_config(
    samples: Sequence, encoders: Sequence[Encoder], parallel: ParallelConfig
) -> MultiEncoderConfig:
    """The N-way search's best configuration on the one profiled sample."""
    return search_encoders([disttrain_encoders_sample(samples, encoders)], encoders, parallel)[0]


def bottleneck_chain(costs: EncodersPlanCosts, ids: Sequence[str]) -> tuple[int, ...]:
    """The stages the batcher's makespan sees: the encoder pipeline with the largest summed forward +
    backward time over ``ids`` (ties: the first), then the LLM's stages."""
    layout: Layout = costs.layout
    ids = tuple(ids)

    def total(group: tuple[int, ...]) -> float:
        return sum(costs.compute_ms(s, k, ids) for s in group for k in (ActionKind.F, ActionKind.B))

    groups = layout.encoder_groups
    best = max(range(len(groups)), key=lambda i: (total(groups[i]), -i))
    llm = tuple(s.stage for s in layout.stages if s.component == "llm")
    return groups[best] + llm


def generate_disttrain_encoders_plan(
    batches: Sequence[Sequence],
    encoders: Sequence[Encoder],
    cfg: MultiEncoderConfig,
    *,
    system: str = DISTTRAIN,
) -> Plan:
    """One iteration per global batch (samples with token metadata) on ``cfg``
    (``disttrain_encoders_config``, say): DistTrain's batcher, 1F1B (module docstring)."""
    layout = encoders_layout(cfg)
    batch_works = []
    samples: dict[str, SampleWork] = {}
    for batch in batches:
        works = [
            SampleWork(w.id, w.encoder, w.llm, w.meta, w.encoders) for w in encoder_works(batch, encoders)
        ]
        samples.update((w.id, w) for w in works)
        batch_works.append(works)
    costs = EncodersPlanCosts(layout, encoders, samples)
    assignments = []
    for works in batch_works:
        chain = bottleneck_chain(costs, [w.id for w in works])

        def times(mb: Sequence[SampleWork], chain=chain) -> np.ndarray:
            ids = tuple(s.id for s in mb)
            return np.array(
                [[costs.compute_ms(s, k, ids) for s in chain] for k in (ActionKind.F, ActionKind.B)]
            )

        assignments.append(assign_disttrain(works, cfg.dp, cfg.num_microbatches, stage_times=times))
    return build_plan(system, layout, assignments, samples, plain_specs, encoders_compute, {})


# --- DIP-like, as published ------------------------------------------------------------------------------
def dip_encoders_parallel(parallel: ParallelConfig) -> tuple[ParallelConfig, int]:
    """DIP's degrees, fixed up front as the one-encoder DIP's (``planning.setups``): TP and CP as given
    (1 when open), DP ``baselines.dip_dp``'s, and every remaining GPU of a replica
    a pipeline rank; ``parallel`` at those degrees and the rank count ``P``."""
    gpus = gpus_of(parallel)
    tp, cp = parallel.tp or 1, parallel.cp or 1
    dp = dip_dp(gpus, tp, cp, parallel.dp)
    pp = gpus // (dp * tp * cp)
    if pp < 1:
        raise ConfigError(f"dip: {gpus} GPUs cannot hold dp {dp} x tp {tp} x cp {cp}")
    return replace(parallel, dp=dp, tp=tp, cp=cp), pp


def _trains(encoder: Encoder) -> bool:
    return any(x.trainable for x in encoder.cost.encoder.layers)


def dip_encoders_layout(
    profile: Sequence, encoders: Sequence[Encoder], parallel: ParallelConfig, *, pp: int
) -> Layout:
    """Pipeline rank ``r`` holds chunk ``r`` of every encoder (stages in encoder order, each encoder's
    consecutive) and of the LLM; each modality split over the ``pp`` ranks by Algorithm 2's min-max
    partition on ``profile`` (``evaluate_config`` with the encoder's units; the LLM's with the first
    encoder that trains, as ``search_encoders`` prices it). ConfigError when a modality has fewer
    layers than ranks."""
    if not encoders:
        raise ConfigError("DIP with several encoders needs at least one encoder")
    tp, cp = parallel.tp or 1, parallel.cp or 1
    trains = [_trains(e) for e in encoders]
    llm_from = trains.index(True) if any(trains) else 0
    stages: list[StageSpec] = []
    llm_cfg = None
    for i, enc in enumerate(encoders):
        try:
            cfg = evaluate_config(
                encoder_stats(profile, enc), enc.cost, parallel, encoder=(tp, cp, pp), llm=(tp, cp, pp)
            )
        except ConfigError as e:
            raise ConfigError(f"dip: encoder {enc.name!r} on {pp} colocated ranks: {e}") from None
        for r, (first, end) in enumerate(cfg.encoder.layer_ranges):
            stages.append(StageSpec(len(stages), "encoder", first, end, r, encoder=enc.name))
        if i == llm_from:
            llm_cfg = cfg
    assert llm_cfg is not None
    for r, (first, end) in enumerate(llm_cfg.llm.layer_ranges):
        stages.append(StageSpec(len(stages), "llm", first, end, r))
    comps = {e.name: ComponentLayout(tp, cp, pp) for e in encoders}
    comps["llm"] = ComponentLayout(tp, cp, pp)
    return Layout(llm_cfg.dp, llm_cfg.microbatch_size, llm_cfg.num_microbatches, comps, tuple(stages))


def _meta(sample):
    return sample if getattr(sample, "meta", None) is None else sample.meta


def dip_encoders_caps(
    profile: Sequence, encoders: Sequence[Encoder]
) -> tuple[dict[str, float | None], float | None]:
    """Each encoder's sub-microbatch cap (twice the profile's mean units per sample: its own units, e.g.
    vision patches, audio rows; None where the mean is 0: that encoder cuts nothing) and the LLM's
    (twice the mean LLM tokens), on the first ``DIP_PROFILE_SAMPLES`` of ``profile``."""
    metas = [_meta(s) for s in list(profile)[:DIP_PROFILE_SAMPLES]]
    n = max(1, len(metas))
    caps: dict[str, float | None] = {}
    for e in encoders:
        mean = sum(sum(e.units(m)) for m in metas) / n
        caps[e.name] = 2.0 * mean if mean > 0 else None
    llm = 2.0 * sum(m.llm_tokens for m in metas) / n
    return caps, (llm if llm > 0 else None)


def cut_by_caps(
    ids: Sequence[str], sizes: Sequence[Sequence[float]], caps: Sequence[float | None]
) -> tuple[tuple[str, ...], ...]:
    """Cut ``ids`` in order into consecutive groups whose sizes stay within every cap (``sizes[i][e]``
    against ``caps[e]``; None: no cap): a sample joins the current group when no running total passes
    its cap, else opens the next (a sample over a cap forms its own group)."""
    groups: list[list[str]] = []
    totals: list[float] = []
    for sid, size in zip(ids, sizes):
        if groups and all(c is None or t + s <= c for t, s, c in zip(totals, size, caps)):
            groups[-1].append(sid)
            totals = [t + s for t, s in zip(totals, size)]
        else:
            groups.append([sid])
            totals = [float(s) for s in size]
    return tuple(tuple(g) for g in groups)


def generate_dip_encoders_plan(
    batches: Sequence[Sequence],
    encoders: Sequence[Encoder],
    layout: Layout,
    caps: tuple[dict[str, float | None], float | None],
    *,
    system: str = DIP,
) -> Plan:
    """One iteration per global batch (samples with token metadata) on DIP's colocated ``layout``
    (``dip_encoders_layout``) with ``caps`` (``dip_encoders_caps``): the ``dip`` batcher's parent
    microbatches, cut into sub-microbatches (``cut_by_caps``), in ``system``'s order (``dip``: the
    phase order; ``dip-greedy``: the greedy interleaver; module docstring)."""
    if system not in (DIP, DIP_GREEDY):
        raise ConfigError(f"{system}: the DIP generator with several encoders runs {DIP} or {DIP_GREEDY}")
    names = [e.name for e in encoders]
    if tuple(names) != layout.encoder_names:
        raise ConfigError(f"encoders {names} do not match the layout's {list(layout.encoder_names)}")
    enc_caps, llm_cap = caps
    batch_works, samples = [], {}
    for batch in batches:
        works = [
            SampleWork(w.id, w.encoder, w.llm, w.meta, w.encoders) for w in encoder_works(batch, encoders)
        ]
        samples.update((w.id, w) for w in works)
        batch_works.append(works)
    units = {sid: tuple(float(sum(e.units(w.meta))) for e in encoders) for sid, w in samples.items()}
    tokens = {sid: (float(w.meta.llm_tokens),) for sid, w in samples.items()}
    enc_limits = [enc_caps.get(n) for n in names]

    def specs(rep: ReplicaAssignment) -> tuple[MicrobatchSpec, ...]:
        out = []
        for pos, i in enumerate(rep.execution_order):
            enc, llm = rep.encoder_microbatches[i], rep.llm_microbatches[i]
            enc_subs = cut_by_caps(enc, [units[s] for s in enc], enc_limits)
            llm_subs = cut_by_caps(llm, [tokens[s] for s in llm], [llm_cap])
            out.append(MicrobatchSpec(pos, i, enc_subs, llm_subs))
        return tuple(out)

    costs = EncodersPlanCosts(layout, encoders, samples)
    order = dip.phase_orders if system == DIP else (lambda graph: dip_greedy.greedy_orders(graph, costs))  # type: ignore[arg-type]
    assignments = [assign_dip(works, layout.dp, layout.num_microbatches) for works in batch_works]
    options = {"dip_encoder_caps": dict(enc_caps), "dip_llm_cap_tokens": llm_cap}
    return build_plan(system, layout, assignments, samples, specs, order, options)


# --- every system ----------------------------------------------------------------------------------------
def generate_config_plan(
    system: str, batches: Sequence[Sequence], encoders: Sequence[Encoder], cfg: MultiEncoderConfig
) -> Plan:
    """``system``'s plan of ``batches`` on a searched configuration ``cfg`` (``CONFIG_SYSTEMS``): Entrain's
    (``encoders_plan``) or DistTrain-like's; what ``entrain train`` plans each step with."""
    if system == ENTRAIN:
        return generate_encoders_plan(batches, encoders, cfg)
    if system == DISTTRAIN:
        return generate_disttrain_encoders_plan(batches, encoders, cfg)
    raise ConfigError(
        f"{system}: no plan of one pipeline per encoder from a searched configuration (those: "
        f"{', '.join(CONFIG_SYSTEMS)})"
    )


def plan_encoders_system(
    system: str,
    profile: Sequence,
    batches: Sequence[Sequence],
    encoders: Sequence[Encoder],
    parallel: ParallelConfig,
) -> Plan:
    """``system``'s Plan for a model with several encoders (``ENCODERS_SYSTEMS``): Entrain's
    (``search_encoders`` on ``profile``, ``encoders_plan``), DistTrain-like's or DIP-like's (module
    docstring; DIP's 4-sample profile: the first of ``profile``); any other system refuses in one line
    (1F1B plans both towers as one encoder component, the one-encoder path)."""
    if system == ENTRAIN:
        return generate_encoders_plan(batches, encoders, search_encoders(profile, encoders, parallel)[0])
    if system == DISTTRAIN:
        cfg = disttrain_encoders_config(profile, encoders, parallel)
        return generate_disttrain_encoders_plan(batches, encoders, cfg)
    if system in (DIP, DIP_GREEDY):
        four = list(profile)[:DIP_PROFILE_SAMPLES]
        at, pp = dip_encoders_parallel(parallel)
        layout = dip_encoders_layout(four, encoders, at, pp=pp)
        return generate_dip_encoders_plan(
            batches, encoders, layout, dip_encoders_caps(four, encoders), system=system
        )
    if system == ONE_F_ONE_B:
        raise ConfigError(
            f"{system} with encoders {[e.name for e in encoders]}: it plans both towers as one encoder component "
            "in the first stages (the one-encoder path), not one pipeline per encoder"
        )
    raise ConfigError(
        f"{system}: encoders {[e.name for e in encoders]} in separate pipelines are not planned by this system "
        f"yet (built: {', '.join(ENCODERS_SYSTEMS)})"
    )
