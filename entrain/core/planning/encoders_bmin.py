"""Algorithm 1 with N encoders judged on the deployed configuration (docs/design.md, "N encoders":
the stability test), what the one-encoder planner does with ``bmin.DeployCheck`` applied to every
encoder group.

``find_b_min_encoders`` (``planning.encoders``) keeps the paper's test: the ``k`` validation draws
agree when they give the reference allocation vector. Here (``find_b_min_encoders_deployed``) a draw
agrees when the configuration Algorithm 2 deploys from it (``deployed_encoders_config``: the best
memory-feasible one of ``search_encoders`` with the draw's own allocation and statistics) exists and,
where its stages differ from the reference draw's, has an N-encoder Eq. 2 time on the reference draw
within ``DeployCheck.tolerance`` of the reference's. A split deploys when every component of it
does: each encoder group's and the LLM's stage count fits its GPUs and layers (``search_encoders``
keeps only such combinations) and every stage of every component fits device memory
(``MultiEncoderConfig.memory_ok``); a split that does not (no such configuration) makes the size
unstable (gap ``inf``). As the one-encoder planner, the doubling stops at the global batch
(``deploy.parallel.global_batch``), not converged there with a ``reason``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from entrain.core.costs.sampler import Sampler, draw_seed, mean_layer_ms
from entrain.core.errors import ConfigError
from entrain.core.planning.bmin import PAPER_BMIN_CONFIG, BMinConfig, DeployCheck, num_validation_trials
from entrain.core.planning.encoders import (
    Encoder,
    EncodersBMin,
    EncodersTrial,
    MultiEncoderConfig,
    allocate_gpus,
    component_totals,
    encoder_stats,
    encoder_works,
    eq2_ms,
    search_encoders,
)

__all__ = [
    "DeployedEncodersTrial",
    "DeployedEncodersBMin",
    "deployed_encoders_config",
    "encoders_eq2_on",
    "encoders_deploy_gap",
    "find_b_min_encoders_deployed",
]


@dataclass(frozen=True, slots=True)
class DeployedEncodersTrial(EncodersTrial):
    """One batch size with the deployed-configuration test: ``eq2_gap`` the largest relative Eq. 2
    difference on the reference draw (``inf``: some draw's split deploys no configuration)."""

    eq2_gap: float = 0.0
    tolerance: float = 0.0

    @property
    def stable(self) -> bool:
        return self.eq2_gap <= self.tolerance

    @property
    def allocation_stable(self) -> bool:
        """The paper's test: every draw gave the reference allocation vector."""
        return len(self.allocations_seen) == 1


@dataclass(frozen=True, slots=True)
class DeployedEncodersBMin(EncodersBMin):
    reason: str | None = None
    """Why the search did not converge (None when it did)."""


def deployed_encoders_config(
    samples: Sequence, encoders: Sequence[Encoder], dp: int, allocation: Sequence[int], deploy: DeployCheck
) -> MultiEncoderConfig | None:
    """Algorithm 2's best memory-feasible configuration for ``allocation`` (each encoder's GPUs, then
    the LLM's, per replica) on ``samples`` with ``dp`` replicas and ``deploy.parallel``'s batch sizes,
    TP and CP; None when none deploys."""
    try:
        parallel = replace(deploy.parallel, gpus=dp * sum(allocation), dp=dp)
        configs = search_encoders(samples, encoders, parallel, allocation=tuple(allocation))
    except ConfigError:
        return None
    return next((c for c in configs if c.memory_ok), None)


def _llm_from(encoders: Sequence[Encoder]) -> int:
    trains = [any(x.trainable for x in e.cost.encoder.layers) for e in encoders]
    return trains.index(True) if any(trains) else 0


def encoders_eq2_on(samples: Sequence, encoders: Sequence[Encoder], cfg: MultiEncoderConfig) -> float:
    """The N-encoder Eq. 2 (``eq2_ms``) of ``cfg``'s stages (their layer ranges as they are) on the
    batch ``samples``: each encoder's stages priced with its own units, the LLM's with the first
    encoder that trains (as ``search_encoders`` prices them)."""
    u = cfg.microbatch_size
    enc_ms = []
    for e, c in zip(encoders, cfg.encoders):
        layer_ms = mean_layer_ms(encoder_stats(samples, e), e.cost, "encoder", c.tp, c.cp, u)
        enc_ms.append([float(layer_ms[f:end].sum()) for f, end in c.layer_ranges])
    first = encoders[_llm_from(encoders)]
    layer_ms = mean_layer_ms(encoder_stats(samples, first), first.cost, "llm", cfg.llm.tp, cfg.llm.cp, u)
    llm_ms = [float(layer_ms[f:end].sum()) for f, end in cfg.llm.layer_ranges]
    return eq2_ms(enc_ms, llm_ms, cfg.num_microbatches)


def _stages(cfg: MultiEncoderConfig) -> tuple:
    return tuple((c.tp, c.cp, c.pp, c.layer_ranges) for c in (*cfg.encoders, cfg.llm))


def encoders_deploy_gap(
    draws: Sequence[Sequence],
    allocations: Sequence[Sequence[int]],
    encoders: Sequence[Encoder],
    dp: int,
    deploy: DeployCheck,
) -> float:
    """Largest relative Eq. 2 difference, on the reference draw (``draws[0]``), between the
    configuration deployed from each validation draw (its own allocation and statistics) and the
    reference draw's; ``inf`` when one of them deploys none."""
    ref = deployed_encoders_config(draws[0], encoders, dp, allocations[0], deploy)
    if ref is None:
        return math.inf
    gap = 0.0
    for draw, alloc in zip(draws[1:], allocations[1:]):
        cfg = deployed_encoders_config(draw, encoders, dp, alloc, deploy)
        if cfg is None:
            return math.inf
        if _stages(cfg) != _stages(ref):
            t = encoders_eq2_on(draws[0], encoders, cfg)
            gap = max(gap, abs(t - ref.predicted_iteration_time_ms) / ref.predicted_iteration_time_ms)
    return gap


def _sizes(n0: int, growth: int, last: int) -> list[int]:
    sizes = [n0]
    while sizes[-1] < last:
        sizes.append(min(sizes[-1] * growth, last))
    return sizes


def find_b_min_encoders_deployed(
    sampler: Sampler,
    encoders: Sequence[Encoder],
    gpus_per_replica: int,
    deploy: DeployCheck,
    config: BMinConfig = PAPER_BMIN_CONFIG,
    *,
    dp: int = 1,
) -> DeployedEncodersBMin:
    """Algorithm 1 with N encoders and the deployed-configuration test (module docstring): ``n`` from
    ``config.n0`` (at most the global batch), multiplied by ``config.growth`` up to the global batch,
    until every draw's split deploys a configuration within the tolerance of the reference draw's;
    draws seeded as ``find_b_min_encoders``' (``draw_seed(seed, n, t)``)."""
    last = deploy.parallel.global_batch
    n0 = min(config.n0, last)
    if n0 < 1 or config.growth < 2:
        raise ConfigError(f"n0 {config.n0}, growth {config.growth}: need n0 >= 1 and growth >= 2")
    k = num_validation_trials(config.alpha, config.p_error)
    trials: list[DeployedEncodersTrial] = []
    for n in _sizes(n0, config.growth, last):
        draws, allocs = [], []
        for t in range(k + 1):
            items = list(sampler(n, draw_seed(config.seed, n, t)))
            if len(items) != n:
                raise ConfigError(f"sampler returned {len(items)} samples, expected {n}")
            draws.append(items)
            allocs.append(allocate_gpus(gpus_per_replica, component_totals(encoder_works(items, encoders))))
        gap = encoders_deploy_gap(draws, allocs, encoders, dp, deploy)
        trials.append(DeployedEncodersTrial(n, allocs[0], tuple(sorted(set(allocs))), gap, deploy.tolerance))
        if trials[-1].stable:
            break
    end = trials[-1]
    reason = None
    if not end.stable:
        seen = ", ".join(":".join(map(str, a)) for a in end.allocations_seen)
        why = "no deployable configuration" if not math.isfinite(end.eq2_gap) else f"{end.eq2_gap:.1%}"
        reason = (
            f"at batch {end.batch_size} (the global batch) the draws give GPU splits {seen} (encoders "
            f"{', '.join(e.name for e in encoders)}, then the LLM), whose deployed configurations differ in "
            f"Eq. 2 time by {why} (tolerance {deploy.tolerance:.1%})"
        )
    return DeployedEncodersBMin(end.batch_size, end.stable, end.reference, k, tuple(trials), reason)
