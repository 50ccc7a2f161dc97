"""Algorithm 1: the smallest profiling batch size ``b_min`` whose GPU split is stable.

``k = ceil(ln(alpha) / ln(1 - p_error))`` validation batches; ``n`` starts at ``n0`` and doubles;
draws are seeded (``draw_seed(seed, n, t)``: ``t = 0`` is the reference batch, ``1..k`` the
validation batches). All ``k`` validation batches are drawn even after a mismatch, so the trial table
lists every allocation seen (like paper Tables 2, 5-11). Ours (``DeployCheck``, used by
``entry.plan``; docs/planner.md): stability is judged on the configuration Algorithm 2 would deploy.
Each validation batch's configuration (Algorithm 2 on its own split and statistics), evaluated on the
reference batch, must have an Eq. 2 time within ``EQ2_TOLERANCE`` of the reference batch's
configuration (splits that deploy the same stages and layer ranges are equal); the doubling stops at
the global batch, ``converged`` False and a ``reason`` when it is not stable there.

``below_b_min_warning`` is the one warning a run prints when its per-replica batch is below ``b_min``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.sampler import (
    MacroscopicProfiler,
    Sampler,
    SampleStats,
    mean_layer_ms,
    proportional_allocation,
)
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.planning.config_search import StaticConfig, search_candidates

__all__ = [
    "EQ2_TOLERANCE",
    "BMinConfig",
    "PAPER_BMIN_CONFIG",
    "DeployCheck",
    "TrialResult",
    "BMinResult",
    "num_validation_trials",
    "find_b_min",
    "below_b_min_warning",
]


def num_validation_trials(alpha: float, p_error: float) -> int:
    """``k = ceil(ln(alpha) / ln(1 - p_error))`` (59 for alpha = p_error = 0.05)."""
    if not (0.0 < alpha < 1.0 and 0.0 < p_error < 1.0):
        raise ConfigError(f"alpha and p_error must be in (0, 1), got {alpha} and {p_error}")
    return math.ceil(math.log(alpha) / math.log(1.0 - p_error) - 1e-12)


EQ2_TOLERANCE = 0.01
"""Algorithm 1 (ours): a validation batch agrees with the reference batch when the configuration
Algorithm 2 deploys from it, evaluated on the reference batch, has a paper Eq. 2 time within this
fraction of the reference batch's own configuration."""


@dataclass(frozen=True, slots=True)
class BMinConfig:
    """Algorithm 1's own parameters: ``k`` from ``alpha`` and ``p_error``, the doubling from ``n0`` by
    ``growth`` up to ``max_batch_size`` (the global batch with a ``DeployCheck``), the draws' ``seed``,
    and ``extra_sizes`` also tried (for a trial table, never for ``b_min``)."""

    alpha: float = 0.05
    p_error: float = 0.05
    n0: int = 4
    growth: int = 2
    seed: int = 0
    max_batch_size: int = 1 << 16
    extra_sizes: tuple[int, ...] = ()


PAPER_BMIN_CONFIG = BMinConfig()
"""The paper's Algorithm 1 parameters (alpha = p_error = 0.05, n0 = 4, doubling, seed 0)."""


@dataclass(frozen=True, slots=True)
class DeployCheck:
    """Algorithm 2's inputs, so that Algorithm 1 judges stability on the configuration that would be
    deployed (``find_b_min(deploy=...)``) and stops at the global batch: ``parallel``'s batch sizes,
    TP and CP (its GPU count and DP are the search's own)."""

    parallel: ParallelConfig
    tolerance: float = EQ2_TOLERANCE

    def __post_init__(self) -> None:
        if not 0.0 <= self.tolerance < 1.0:
            raise ConfigError(f"the Eq. 2 tolerance must be in [0, 1), got {self.tolerance}")


@dataclass(frozen=True, slots=True)
class TrialResult:
    """One batch size of Algorithm 1: the reference allocation, every allocation seen (encoder GPUs
    descending) and whether the ``k`` validation batches agree with the reference."""

    batch_size: int
    reference: tuple[int, int]
    allocations_seen: tuple[tuple[int, int], ...]
    stable: bool
    """Without a ``DeployCheck``: every validation batch's split equals the reference's (the paper's
    test). With one: the configuration Algorithm 2 deploys from every validation batch has, on the
    reference batch, an Eq. 2 time within the tolerance of the reference batch's configuration."""
    encoder_shares: tuple[float, ...]
    """Reference share first, then the validation batches'."""
    eq2_gap: float = 0.0
    """Largest relative Eq. 2 difference, on the reference batch, between the configuration deployed
    from a validation batch and the reference batch's (0 when all deploy the same stages; inf when one
    has no feasible configuration; without a ``DeployCheck``: 0 or inf by the split test)."""

    @property
    def allocation_stable(self) -> bool:
        """The paper's test: every validation batch gave the reference split."""
        return len(self.allocations_seen) == 1

    def to_json(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "allocations_seen": [list(a) for a in self.allocations_seen],
            "stable": self.stable,
            "reference": list(self.reference),
            "allocation_stable": self.allocation_stable,
            "eq2_gap": self.eq2_gap if math.isfinite(self.eq2_gap) else None,
        }


@dataclass(frozen=True, slots=True)
class BMinResult:
    b_min: int
    """Smallest stable size on the doubling path (the largest size tried when ``converged`` is False)."""
    converged: bool
    k_trials: int
    gpus_per_replica: int
    allocation: tuple[int, int]
    """Reference allocation at ``b_min``."""
    trials: tuple[TrialResult, ...]
    """Doubling path plus any extra sizes requested, by batch size."""
    alpha: float
    p_error: float
    n0: int
    seed: int
    max_batch_size: int = 1 << 16
    """The search's last size (the global batch when Algorithm 1 ran with a ``DeployCheck``)."""
    tolerance: float | None = None
    """Eq. 2 tolerance of the stability test; None = the paper's exact split test."""
    reason: str | None = None
    """Why the search did not converge (None when it did)."""

    def trial(self, batch_size: int) -> TrialResult:
        return next(t for t in self.trials if t.batch_size == batch_size)


def _deployed(stats: SampleStats, cost: CostModel, dp: int, allocation, deploy: DeployCheck):
    """Algorithm 2's best memory-feasible configuration for ``allocation`` on ``stats`` (None if none)."""
    try:
        parallel = replace(deploy.parallel, gpus=dp * sum(allocation), dp=dp)
        cands = search_candidates(stats, cost, parallel, allocation=allocation)
    except ConfigError:
        return None
    return next((c for c in cands if c.memory_ok), None)


def _eq2_on(stats: SampleStats, cost: CostModel, cfg: StaticConfig) -> float:
    """Paper Eq. 2 of ``cfg``'s stages (its layer ranges as they are) on the batch ``stats``."""
    stage_ms: list[float] = []
    for comp in (cfg.encoder, cfg.llm):
        layer_ms = mean_layer_ms(stats, cost, comp.name, comp.tp, comp.cp, cfg.microbatch_size)
        stage_ms += [float(layer_ms[f:e].sum()) for f, e in comp.layer_ranges]
    return sum(stage_ms) + (cfg.num_microbatches - 1) * max(stage_ms)


def _stages(cfg: StaticConfig) -> tuple:
    return tuple((c.tp, c.cp, c.pp, c.layer_ranges) for c in (cfg.encoder, cfg.llm))


def _deploy_gap(profiler: MacroscopicProfiler, n: int, k: int, dp: int, allocs, deploy: DeployCheck) -> float:
    """Largest relative Eq. 2 difference, on the reference batch, between the configuration Algorithm 2
    deploys from a validation batch (its own split and statistics) and the reference batch's."""
    ref_stats = profiler.draw(n, 0)[1]
    ref = _deployed(ref_stats, profiler.cost, dp, allocs[0], deploy)
    if ref is None:
        return math.inf
    gap = 0.0
    for t in range(1, k + 1):
        cfg = _deployed(profiler.draw(n, t)[1], profiler.cost, dp, allocs[t], deploy)
        if cfg is None:
            return math.inf
        if _stages(cfg) != _stages(ref):
            t_ms = _eq2_on(ref_stats, profiler.cost, cfg)
            gap = max(gap, abs(t_ms - ref.predicted_iteration_time_ms) / ref.predicted_iteration_time_ms)
    return gap


def _trial(
    profiler: MacroscopicProfiler, n: int, k: int, gpus_per_replica: int, dp: int, deploy: DeployCheck | None
) -> TrialResult:
    shares = [profiler.encoder_share(n, t) for t in range(k + 1)]
    allocs = [proportional_allocation(gpus_per_replica, s) for s in shares]
    seen = tuple(sorted(set(allocs), key=lambda a: (-a[0], a[1])))
    if deploy is None:
        gap, stable = (0.0 if len(seen) == 1 else math.inf), len(seen) == 1
    else:
        gap = _deploy_gap(profiler, n, k, dp, allocs, deploy)
        stable = gap <= deploy.tolerance
    return TrialResult(n, allocs[0], seen, stable, tuple(shares), gap)


def _doubling_sizes(n0: int, growth: int, last: int) -> list[int]:
    """``n0, n0 * growth, ...`` up to ``last``, ending exactly at ``last``."""
    sizes = [n0]
    while sizes[-1] < last:
        sizes.append(min(sizes[-1] * growth, last))
    return sizes


def _not_converged_reason(last: TrialResult, deploy: DeployCheck | None) -> str:
    seen = ", ".join(f"{e}:{m}" for e, m in last.allocations_seen)
    where = "the global batch" if deploy is not None else "the largest size tried"
    if deploy is None:
        return f"at batch {last.batch_size} ({where}) the validation draws still give GPU splits {seen}"
    gap = "no feasible configuration" if not math.isfinite(last.eq2_gap) else f"{last.eq2_gap:.1%}"
    return (
        f"at batch {last.batch_size} ({where}) the validation draws give GPU splits {seen}, whose deployed "
        f"configurations differ in Eq. 2 time by {gap} (tolerance {deploy.tolerance:.1%})"
    )


def find_b_min(
    sampler: Sampler | MacroscopicProfiler,
    cost: CostModel,
    parallel: ParallelConfig,
    config: BMinConfig = PAPER_BMIN_CONFIG,
    *,
    deploy: DeployCheck | None = None,
) -> BMinResult:
    """Algorithm 1 on ``parallel.gpus`` GPUs in ``parallel.dp`` replicas: the smallest profiling batch
    size whose GPU split is stable over ``k`` draws (``config``: Algorithm 1's parameters).

    Without ``deploy``: the paper's test (every draw gives the reference split), doubling up to
    ``config.max_batch_size``. With ``deploy`` (what ``plan`` uses): splits whose Algorithm 2
    configurations have Eq. 2 times within ``deploy.tolerance`` count as the same, and the search
    stops at ``deploy.parallel.global_batch`` (``converged`` False and ``reason`` when it is not stable there).
    """
    gpus, dp = parallel.gpus, parallel.dp
    alpha, p_error, n0, growth = config.alpha, config.p_error, config.n0, config.growth
    if gpus is None or dp is None:
        raise ConfigError("Algorithm 1 needs the GPU count and the DP degree (--gpus, --dp)")
    if dp < 1 or gpus % dp:
        raise ConfigError(f"--gpus {gpus} is not divisible by --dp {dp}")
    if n0 < 1 or growth < 2:
        raise ConfigError(f"n0 must be >= 1 and growth >= 2, got {n0} and {growth}")
    last = deploy.parallel.global_batch if deploy is not None else config.max_batch_size
    if n0 > last:
        raise ConfigError(f"n0 {n0} exceeds the largest profiling batch size {last}")
    profiler = (
        sampler
        if isinstance(sampler, MacroscopicProfiler)
        else MacroscopicProfiler(sampler, cost, seed=config.seed)
    )
    g = gpus // dp
    k = num_validation_trials(alpha, p_error)
    trials: dict[int, TrialResult] = {}
    for n in _doubling_sizes(n0, growth, last):
        trials[n] = _trial(profiler, n, k, g, dp, deploy)
        b_min = n
        if trials[n].stable:
            break
    converged = trials[b_min].stable
    for size in config.extra_sizes:
        if size not in trials:
            trials[size] = _trial(profiler, int(size), k, g, dp, deploy)
    return BMinResult(
        b_min=b_min,
        converged=converged,
        k_trials=k,
        gpus_per_replica=g,
        allocation=trials[b_min].reference,
        trials=tuple(trials[s] for s in sorted(trials)),
        alpha=alpha,
        p_error=p_error,
        n0=n0,
        seed=profiler.seed,
        max_batch_size=last,
        tolerance=deploy.tolerance if deploy is not None else None,
        reason=None if converged else _not_converged_reason(trials[b_min], deploy),
    )


def below_b_min_warning(global_batch: int, dp: int, b_min: int | None) -> str | None:
    """The one warning a run prints when its per-replica batch (``global_batch / dp``) is below
    ``b_min`` (None: none to print, or ``b_min`` unknown)."""
    per_replica = global_batch // dp
    if b_min is None or per_replica >= b_min:
        return None
    return (
        f"entrain: warning: --global-batch {global_batch} ({per_replica} per replica) is below b_min = {b_min} "
        f"for this dataset and layout (Algorithm 1): the encoder/LLM work split varies from batch to batch at "
        f"this size, so the balance guarantee no longer holds; use --global-batch {b_min * dp} or more"
    )
