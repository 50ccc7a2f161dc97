"""The baselines' configurations: DistTrain's one-sample profile, paper Table 1's configurations and
DIP's colocated layout."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.sampler import Item, Sampler, SampleStats, draw_seed
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.ir.plan import ComponentLayout, Layout, StageSpec
from entrain.core.planning.config_search import StaticConfig, evaluate_config
from entrain.core.systems import DIP, DISTTRAIN, ENTRAIN
from entrain.core.workload.aliases import canonical_dataset

__all__ = [
    "disttrain_profile_sample",
    "PAPER_TABLE1",
    "PAPER_TP",
    "PAPER_DP",
    "PAPER_GLOBAL_BATCH",
    "PAPER_MICROBATCH",
    "paper_table1_config",
    "dip_layout",
    "dip_dp",
]


def disttrain_profile_sample(
    sampler: Sampler, cost: CostModel, *, seed: int = 0, num_draw: int = 1024
) -> Item:
    """DistTrain profiles one sample: the median encoder:LLM work-ratio sample of a seeded
    ``num_draw``-sample draw (stable sort on (ratio, id); the lower median)."""
    items = sampler(num_draw, draw_seed(seed, num_draw, 0x0D15))
    enc, llm = SampleStats.of(items).work(cost)
    ratio = enc / np.maximum(llm, 1e-300)
    order = sorted(range(len(items)), key=lambda i: (float(ratio[i]), items[i].id))
    return items[order[(len(items) - 1) // 2]]


PAPER_TABLE1: dict[tuple[str, str], dict[str, tuple[int, int]]] = {
    ("synthchartnet", "qwen25vl-llama3-1b"): {DISTTRAIN: (4, 4), DIP: (8, 8), ENTRAIN: (5, 3)},
    ("synthchartnet", "qwen25vl-llama3-3b"): {DISTTRAIN: (5, 3), DIP: (8, 8), ENTRAIN: (4, 4)},
    ("llava150k", "qwen25vl-llama3-1b"): {DISTTRAIN: (5, 3), DIP: (8, 8), ENTRAIN: (4, 4)},
    ("chartqa", "qwen25vl-llama3-1b"): {DISTTRAIN: (5, 3), DIP: (8, 8), ENTRAIN: (5, 3)},
    ("cocoqa", "qwen25vl-llama3-1b"): {DISTTRAIN: (4, 4), DIP: (8, 8), ENTRAIN: (5, 3)},
    ("llava150k", "qwen25vl-llama3-3b"): {DISTTRAIN: (4, 4), DIP: (8, 8), ENTRAIN: (3, 5)},
    ("chartqa", "qwen25vl-llama3-3b"): {DISTTRAIN: (4, 4), DIP: (8, 8), ENTRAIN: (4, 4)},
    ("cocoqa", "qwen25vl-llama3-3b"): {DISTTRAIN: (4, 4), DIP: (8, 8), ENTRAIN: (3, 5)},
}
"""Paper Table 1 (E.PP, L.PP) per system; all with TP 2, CP 1, DP 4, microbatch 4, global batch 512.
DIP's (8, 8) = both modalities over the same 8 ranks."""

PAPER_TP, PAPER_DP, PAPER_GLOBAL_BATCH, PAPER_MICROBATCH = 2, 4, 512, 4


def paper_table1_config(
    dataset: str,
    model: str,
    profile: Sequence[Item] | SampleStats,
    cost: CostModel,
    *,
    system: str = DISTTRAIN,
    global_batch: int = PAPER_GLOBAL_BATCH,
    microbatch_size: int = PAPER_MICROBATCH,
) -> StaticConfig:
    """Table 1's (E.PP, L.PP) for ``system`` with TP 2, DP 4; layer ranges by the min-max DP on
    ``profile`` (DistTrain: its one-sample profile). ConfigError for pairs the table lacks."""
    key = (canonical_dataset(dataset), model)
    if key not in PAPER_TABLE1:
        known = ", ".join(f"{d}/{m}" for d, m in PAPER_TABLE1)
        raise ConfigError(f"paper Table 1 has no configuration for {dataset}/{model}; it covers {known}")
    if system not in (DISTTRAIN, ENTRAIN):
        raise ConfigError(
            f"Table 1 disjoint-stage configs exist for {DISTTRAIN} and {ENTRAIN}, not {system!r}"
        )
    e_pp, l_pp = PAPER_TABLE1[key][system]
    parallel = ParallelConfig(
        dp=PAPER_DP, tp=PAPER_TP, global_batch=global_batch, microbatch_size=microbatch_size
    )
    return evaluate_config(profile, cost, parallel, encoder=(PAPER_TP, 1, e_pp), llm=(PAPER_TP, 1, l_pp))


def dip_dp(gpus: int, tp: int, cp: int = 1, dp: int | None = None) -> int:
    """DIP's data-parallel degree, fixed up front like its TP and CP: ``dp`` as given, else 4 (fewer
    replicas where ``gpus`` holds fewer than two ranks each), whichever other systems run beside it."""
    return dp or max(1, min(4, gpus // (2 * tp * cp)))


def dip_layout(
    profile: Sequence[Item] | SampleStats,
    cost: CostModel,
    parallel: ParallelConfig,
    *,
    pp: int,
) -> Layout:
    """DIP-like colocated layout on ``parallel``'s DP, TP, CP and batch sizes: pipeline rank ``r`` of
    a replica holds encoder chunk ``r`` (stage ``r``) and LLM chunk ``r`` (stage ``pp + r``); each
    modality is split over all ``pp`` ranks by the min-max DP on ``profile`` (DIP: its 4-sample
    profile)."""
    tp, cp = parallel.tp, parallel.cp
    cfg = evaluate_config(profile, cost, parallel, encoder=(tp, cp, pp), llm=(tp, cp, pp))
    dp, microbatch_size = cfg.dp, cfg.microbatch_size
    stages = [StageSpec(r, "encoder", f, e, r) for r, (f, e) in enumerate(cfg.encoder.layer_ranges)]
    stages += [StageSpec(pp + r, "llm", f, e, r) for r, (f, e) in enumerate(cfg.llm.layer_ranges)]
    return Layout(
        dp=dp,
        microbatch_size=microbatch_size,
        num_microbatches=cfg.num_microbatches,
        components={"encoder": ComponentLayout(tp, cp, pp), "llm": ComponentLayout(tp, cp, pp)},
        stages=tuple(stages),
    )
