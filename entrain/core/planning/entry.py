"""The planner's entry point: Algorithm 1 (``bmin``) then Algorithm 2 (``config_search``) for a run,
per DP degree when DP is not fixed."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.sampler import MacroscopicProfiler, Sampler
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.planning.bmin import (
    EQ2_TOLERANCE,
    PAPER_BMIN_CONFIG,
    BMinConfig,
    BMinResult,
    DeployCheck,
    find_b_min,
)
from entrain.core.planning.config_search import StaticConfig, dp_options, gpus_of, search_config

__all__ = ["PlanResult", "plan"]


@dataclass(frozen=True, slots=True)
class PlanResult:
    """Algorithm 1 + Algorithm 2 for one run: the b_min search (of the chosen DP) and the config."""

    b_min: BMinResult
    config: StaticConfig
    per_dp: dict[int, tuple[BMinResult, StaticConfig]] = field(default_factory=dict)


def plan(
    sampler: Sampler,
    cost: CostModel,
    parallel: ParallelConfig,
    bmin_config: BMinConfig = PAPER_BMIN_CONFIG,
    *,
    tolerance: float = EQ2_TOLERANCE,
) -> PlanResult:
    """Find ``b_min`` on ``parallel.gpus`` (per DP visited when ``parallel.dp`` is None; stability
    judged on the deployed configuration, ``DeployCheck``, up to the global batch) and search the
    configuration from the reference batch drawn at ``b_min``; the result is the DP with the best
    Eq. 2 time (``bmin_config``: Algorithm 1's parameters; its ``max_batch_size`` is the global batch)."""
    profiler = MacroscopicProfiler(sampler, cost, seed=bmin_config.seed)
    deploy = DeployCheck(parallel, tolerance)
    gpus, global_batch = gpus_of(parallel), parallel.global_batch
    per_dp = {}
    last_error: ConfigError | None = None
    for d in dp_options(gpus, parallel.dp, global_batch, parallel.microbatch_size):
        one = replace(bmin_config, n0=min(bmin_config.n0, global_batch))
        bmin = find_b_min(profiler, cost, replace(parallel, gpus=gpus, dp=d), one, deploy=deploy)
        _, stats = profiler.draw(bmin.b_min, 0)
        try:
            cfg = search_config(stats, cost, replace(parallel, dp=d))
        except ConfigError as err:
            if parallel.dp is not None:
                raise
            last_error = err
            continue
        per_dp[d] = (bmin, cfg)
    if not per_dp:
        raise ConfigError(f"no DP degree yields a feasible configuration on {gpus} GPUs; e.g. {last_error}")
    best = min(per_dp, key=lambda d: per_dp[d][1].sort_key())
    return PlanResult(per_dp[best][0], per_dp[best][1], per_dp)
