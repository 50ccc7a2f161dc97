"""Each system's own configuration (docs/design.md §2), chosen the way its method would choose it
(``SystemSpec.config`` in ``entrain.core.systems``). ``simulate``, ``bench`` and ``train`` (without
``--plan``) all configure systems here; the profiling samples come from the caller's ``Sampler``.

* ``entrain``, ``entrain-1f1b``, ``1f1b``: Algorithm 1 (``b_min``) then Algorithm 2 on the
  ``b_min`` reference batch (``planning.entry.plan``).
* ``disttrain``: Algorithm 2 on one profiled sample (``planning.baselines.disttrain_profile_sample``).
* ``encoder-rebalance``: DistTrain's (above).
* ``dflop``: Algorithm 2 on one draw of a global batch, our stand-in for DFLOP's Data-aware 3D
  Parallelism Optimizer, which picks each module's layout from the profiled input-shape distribution
  (docs/baselines.md, "DFLOP": the paper's parts we follow and every difference). Each module's TP
  and CP are searched on their own (they can differ where ``--tp`` is open), under one DP.
* ``disttrain-paper``: the paper's Table 1 DistTrain config (``planning.baselines.paper_table1_config``).
* ``dip``, ``dip-greedy``: the colocated layout over all ``gpus / (dp * tp)`` ranks of a replica
  (dp: ``--dp``, else 4: ``planning.baselines.dip_dp``, the same whichever systems run beside it)
  ``planning.baselines.dip_layout`` from a 4-sample profile (one microbatch), whose mean per-sample ViT
  patches and LLM tokens, doubled, cap the sub-microbatches.

Configs are computed once per (system kind, dataset, cost model) and shared by systems that use
the same one.

Entrain's extensions are chosen in ``entrain.core.planning.extensions``; the setup's types, its decisions and
its plan-file form are in ``entrain.core.planning.system_setup``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.sampler import MacroscopicProfiler, Sampler, draw_seed
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.planning.baselines import dip_dp, dip_layout, disttrain_profile_sample, paper_table1_config
from entrain.core.planning.bmin import BMinConfig
from entrain.core.planning.config_search import evaluate_config, search_config
from entrain.core.planning.entry import PlanResult, plan
from entrain.core.planning.extensions import (
    DECISIONS,
    ENTRAIN_LAYOUTS,
    entrain_variant,
    extended,
    tied_configs,
)
from entrain.core.planning.system_setup import (
    DECISION_MARGIN,
    LAYOUT_MARGIN,
    PLAN_FILE_KEYS,
    CandidateJudge,
    ConfigRequest,
    Decision,
    SystemSetup,
    decide,
    departs,
    pick,
    read_plan_file,
    setup_to_json,
)
from entrain.core.systems import (
    CONFIG_DFLOP,
    CONFIG_DISTTRAIN,
    CONFIG_DISTTRAIN_PAPER,
    CONFIG_ENTRAIN,
    DISTTRAIN,
    get_system,
)
from entrain.core.workload.work import SampleWork

__all__ = [
    "SystemSetup",
    "ConfigRequest",
    "system_setups",
    "config_kind",
    "entrain_variant",
    "ENTRAIN_LAYOUTS",
    "LAYOUT_MARGIN",
    "DECISION_MARGIN",
    "DECISIONS",
    "Decision",
    "CandidateJudge",
    "departs",
    "pick",
    "decide",
    "tied_configs",
    "entrain_setup",
    "fixed_stage_setup",
    "setup_to_json",
    "read_plan_file",
    "PLAN_FILE_KEYS",
]


def config_kind(system: str) -> str:
    return get_system(system).config


def _setup(kind: str, req: ConfigRequest, cost: CostModel, sampler: Sampler) -> SystemSetup:
    if kind == CONFIG_ENTRAIN:
        res = plan(sampler, cost, req.parallel, BMinConfig(seed=req.seed, extra_sizes=tuple(req.extra_sizes)))
        return entrain_setup(res, sampler, cost, req.seed)
    if kind == CONFIG_DISTTRAIN:
        one = disttrain_profile_sample(sampler, cost, seed=req.seed)
        cfg = search_config([one], cost, req.parallel)
        return SystemSetup(cfg.to_layout(), {}, "Algorithm 2 on one sample", profile=[one])
    if kind == CONFIG_DFLOP:
        profile = sampler(req.global_batch, draw_seed(req.seed, req.global_batch, 0xDF1))
        cfg = search_config(profile, cost, req.parallel)
        return SystemSetup(cfg.to_layout(), {}, "Algorithm 2 on a global-batch draw (DFLOP)", profile=profile)
    if kind == CONFIG_DISTTRAIN_PAPER:
        one = disttrain_profile_sample(sampler, cost, seed=req.seed)
        cfg = paper_table1_config(
            req.dataset, req.model, [one], cost, system=DISTTRAIN, global_batch=req.global_batch,
            microbatch_size=req.microbatch_size,
        )  # fmt: skip
        return SystemSetup(cfg.to_layout(), {}, "paper Table 1")
    profile = sampler(4, draw_seed(req.seed, 4, 0xD1B))
    dp = dip_dp(req.gpus, req.tp, dp=req.dp)
    pp = req.gpus // (dp * req.tp)
    if pp < 1:
        raise ConfigError(f"dip: --gpus {req.gpus} cannot hold dp {dp} x tp {req.tp}")
    layout = dip_layout(profile, cost, replace(req.parallel, dp=dp), pp=pp)
    return SystemSetup(
        layout, _dip_caps(profile, cost, req.tp), "colocated, 4-sample profile", profile=profile
    )


def entrain_setup(res: PlanResult, sampler: Sampler, cost: CostModel, seed: int) -> SystemSetup:
    """Entrain's setup from the planner's result (Algorithm 1 + 2), before the extensions."""
    profiler = MacroscopicProfiler(sampler, cost, seed=seed)
    profile = profiler.draw(res.b_min.b_min, 0)[1]
    batch = (
        profiler.draw(res.config.global_batch, 0)[1] if res.config.global_batch > res.b_min.b_min else None
    )
    source = f"Algorithm 1+2 (b_min={res.b_min.b_min})"
    return SystemSetup(
        res.config.to_layout(), {}, source, res.b_min.b_min, res.b_min, profile, config=res.config,
        batch_profile=batch,
    )  # fmt: skip


def fixed_stage_setup(
    system: str,
    req: ConfigRequest,
    cost: CostModel,
    profile,
    encoder_stages: int,
    llm_stages: int,
    judge: CandidateJudge | None = None,
) -> SystemSetup:
    """``system``'s setup with the stage counts fixed (``train --encoder-stages/--llm-stages``): the
    layers split by Algorithm 2's partitioner (``planning.config_search.evaluate_config``) over ``profile``, on
    ``req.dp`` replicas; Entrain's extensions as ``req`` asks (``entrain_variant``, ``judge``)."""
    tp = req.tp  # the GPU count is the layout's (req.gpus may be unset)
    parallel = ParallelConfig(
        dp=req.dp or 1, tp=tp, global_batch=req.global_batch, microbatch_size=req.microbatch_size
    )
    source = f"stages fixed by flags ({encoder_stages} encoder + {llm_stages} LLM), Algorithm 2's partition"
    spec = get_system(system)
    if spec.colocated:
        if encoder_stages != llm_stages:
            raise ConfigError(
                f"{system}: colocated layouts need equal stage counts, got {encoder_stages} + {llm_stages}"
            )
        layout = dip_layout(profile, cost, parallel, pp=encoder_stages)
        return SystemSetup(layout, _dip_caps(profile, cost, tp), source, profile=profile)
    cfg = evaluate_config(profile, cost, parallel, encoder=(tp, 1, encoder_stages), llm=(tp, 1, llm_stages))
    setup = SystemSetup(cfg.to_layout(), {}, source, profile=profile, config=cfg)
    if spec.extensions:
        return entrain_variant(setup, req, cost, judge, ties=False)
    return setup


def _dip_caps(profile, cost: CostModel, tp: int) -> dict:
    metas = [p.meta if isinstance(p, SampleWork) else p for p in profile]
    if any(m is None for m in metas):
        return {}  # raw-work profile: the generator derives caps from linear-equivalent tokens
    n = max(1, len(metas))
    return {
        "dip_encoder_cap_patches": 2.0 * sum(m.vit_patches for m in metas) / n,
        "dip_llm_cap_tokens": 2.0 * sum(m.llm_tokens for m in metas) / n,
    }


def system_setups(
    systems: Sequence[str],
    req: ConfigRequest,
    cost: CostModel,
    sampler: Sampler,
    judge: CandidateJudge | None = None,
    unbuilt: dict[str, str] | None = None,
) -> dict[str, SystemSetup]:
    """Each system's setup; ``sampler`` = the dataset's profiling sampler
    (``entrain.data.sampling.dataset_sampler``, the one ``plan`` uses); ``judge`` simulates Entrain's
    layout candidates (``entrain_variant``).

    ``unbuilt``: where given (a comparison of several systems, ``entrain simulate``), a baseline whose
    configuration cannot be built (``ConfigError``: e.g. DIP's ``gpus / (dp * tp)`` colocated ranks
    outnumbering a component's layers, a stage count no partition can reach) is left out of the result
    and recorded here as ``{system: reason}``, reported as not fitting instead of ending the run.
    Entrain's own configuration still raises (nothing to compare against), and so does every system
    where ``unbuilt`` is None (``plan``, ``train``: the one system asked for)."""
    by_kind: dict[str, SystemSetup] = {}
    failed: dict[str, str] = {}
    kinds = sorted({config_kind(n) for n in systems}, key=lambda k: k != CONFIG_ENTRAIN)
    for kind in kinds:
        try:
            by_kind[kind] = _setup(kind, req, cost, sampler)
        except ConfigError as err:
            if unbuilt is None or kind == CONFIG_ENTRAIN:
                raise
            failed[kind] = f"cannot be built: {err}"
    for name in systems:
        if config_kind(name) in failed:
            unbuilt[name] = failed[config_kind(name)]  # type: ignore[index]
    out = {name: by_kind[config_kind(name)] for name in systems if config_kind(name) in by_kind}
    extensible = [n for n in out if get_system(n).extensions]
    if extensible and extended(req):
        variant = entrain_variant(by_kind[CONFIG_ENTRAIN], req, cost, judge)
        out.update({n: variant for n in extensible})
    return out
