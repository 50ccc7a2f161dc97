"""Macroscopic planning: Algorithm 1 (``b_min``) and Algorithm 2 (static configuration search).

Pinned as in DESIGN.md section 1:

* Workload of a sample = forward + backward ms of each whole component at TP = CP = 1, per-call
  constants excluded (``CostModel.sample_work``). A batch's encoder share ``P`` = total encoder work /
  total work.
* ProportionalAllocation: the encoder gets ``round(G * P)`` of a replica's ``G`` GPUs, rounded to the
  nearest whole GPU with ties to the LLM, clamped so each component keeps at least one GPU.
* Algorithm 1: ``k = ceil(ln(alpha) / ln(1 - p_error))`` validation batches; ``n`` starts at
  ``n0`` and doubles; draws are seeded (``draw_seed(seed, n, t)``: ``t = 0`` is the reference batch,
  ``1..k`` the validation batches). All ``k`` validation batches are drawn even after a mismatch, so
  the trial table lists every allocation seen (like paper Tables 2, 5-11). Ours (``DeployCheck``,
  used by ``plan``; docs/planner.md): stability is judged on the configuration Algorithm 2 would
  deploy. Each validation batch's configuration (Algorithm 2 on its own split and statistics),
  evaluated on the reference batch, must have an Eq. 2 time within ``EQ2_TOLERANCE`` of the
  reference batch's configuration (splits that deploy the same stages and layer ranges are equal);
  the doubling stops at the global batch, ``converged`` False and a ``reason`` when it is not
  stable there.
* Algorithm 2: per component, every TP x CP with ``PP = floor(M/(TP*CP))`` and ``ceil(M/(TP*CP))``
  (both tried, at least 1, clamped to the component's layer count), combined so the replica's GPUs are
  not exceeded; a 1-D min-max layer partition per component (``partition.min_max_partition``) of the
  mean microbatch's per-layer forward + backward times; score = paper Eq. 2,
  ``sum(stage times) + (K - 1) * slowest stage`` with ``K = B / (dp * U)``; a candidate is dropped if a
  stage's memory (weights + gradients + Adam states of trainable layers, bf16 weights of frozen ones,
  divided by TP, plus the activations of its 1F1B in-flight microbatches) exceeds
  ``HardwareSpec.device_memory_bytes``, or if ``B`` is not divisible by ``dp * U``. Best = lowest Eq. 2
  time (= highest throughput ``dp * K / T``); ties go to fewer GPUs, then the lexicographically
  smallest (dp, encoder tp, cp, pp, llm tp, cp, pp).

Extension (ours, not the paper's): ``boundary_sharing_config`` partitions the concatenated
encoder-then-LLM layer list over a replica's pipeline ranks in one min-max pass, so the rank where
the modalities meet may hold the last encoder stage and the first LLM stage (same TP x CP on both).
Its Eq. 2 time is never above the disjoint split's on the same ranks (the disjoint split is one of
its candidate partitions); ``entrain.core.setups`` uses it for Entrain where Eq. 2 is lower.

A *sampler* is ``sampler(n, seed) -> Sequence[SampleMeta | SampleWork]``: ``n`` samples drawn i.i.d.
(with replacement) from the dataset with that seed: ``pool_sampler`` over a fixed list, which
``entrain.data.sampling.dataset_sampler`` builds for every command. Items without token metadata (raw-work samples) are supported for
Algorithm 1; Algorithm 2 then spreads a component's work over its layers by their linear costs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from entrain.core.costmodel import COMPONENTS, RECOMPUTE_MODES, CostModel, parallel_key
from entrain.core.errors import ConfigError
from entrain.core.parallel import num_microbatches
from entrain.core.partition import min_max_partition
from entrain.core.plan import ComponentLayout, Layout, StageSpec
from entrain.core.sample_table import SampleTable, TableDraw
from entrain.core.samples import SampleMeta
from entrain.core.work import SampleWork

__all__ = [
    "Sampler",
    "SampleStats",
    "MacroscopicProfiler",
    "TrialResult",
    "BMinResult",
    "DeployCheck",
    "EQ2_TOLERANCE",
    "ComponentConfig",
    "StaticConfig",
    "PlanResult",
    "num_validation_trials",
    "proportional_allocation",
    "draw_seed",
    "pool_sampler",
    "MEMORY_CHECK_REPLICA_ITERATIONS",
    "memory_check_iterations",
    "find_b_min",
    "search_candidates",
    "search_config",
    "evaluate_config",
    "plan",
    "disttrain_profile_sample",
    "PAPER_TABLE1",
    "paper_table1_config",
    "dip_layout",
    "SharedBoundaryConfig",
    "boundary_sharing_config",
]

Item = SampleMeta | SampleWork
Sampler = Callable[[int, int], Sequence[Item]]

ADAM_BYTES_PER_BF16_WEIGHT_BYTE = 9.0
"""Trainable layer: bf16 weight (2) + fp32 gradient (4) + fp32 master, m, v (12) = 18 bytes per
parameter = 9x its bf16 ``param_bytes``."""


# --------------------------------------------------------------------------------------------------
# Per-sample statistics and vectorised work
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SampleStats:
    """Column statistics of a batch: per sample, encoder units' sum and sum of squares (ViT patches
    over its images), LLM tokens and their square; ``raw_*`` = given work for items without metadata
    (NaN otherwise)."""

    ids: Sequence[str]
    enc_x1: np.ndarray
    enc_x2: np.ndarray
    llm_x1: np.ndarray
    llm_x2: np.ndarray
    raw_encoder: np.ndarray
    raw_llm: np.ndarray
    _memo: dict = field(default_factory=dict, compare=False, repr=False)
    """Column means, maxima and ``has_tokens``, computed once (the arrays are never changed)."""

    @classmethod
    def of(cls, items: Sequence[Item]) -> SampleStats:
        if isinstance(items, SampleTable):
            items = items.take(np.arange(len(items)))
        if isinstance(items, TableDraw):  # columns, no record built
            enc_x1, enc_x2, llm_x1 = items.columns()
            nan = np.full(len(items), np.nan)
            return cls(items.ids, enc_x1, enc_x2, llm_x1, llm_x1 * llm_x1, nan, nan.copy())
        n = len(items)
        cols = np.full((6, n), np.nan)
        ids = []
        for j, item in enumerate(items):
            meta = item if isinstance(item, SampleMeta) else item.meta
            ids.append(item.id)
            if meta is not None:
                patches = meta.vit_patches_per_image
                x = meta.llm_tokens
                cols[0, j] = sum(patches)
                cols[1, j] = sum(p * p for p in patches)
                cols[2, j] = x
                cols[3, j] = x * x
            else:
                cols[4, j] = item.encoder
                cols[5, j] = item.llm
        return cls(tuple(ids), *cols)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def has_tokens(self) -> bool:
        got = self._memo.get("has_tokens")
        if got is None:
            got = self._memo["has_tokens"] = not np.isnan(self.enc_x1).any()
        return got

    def column_summary(self, comp: str) -> tuple[float, float, float, float]:
        """``comp``'s (mean x, mean x^2, x and x^2 of the sample with the largest x; the first of equals)."""
        got = self._memo.get(comp)
        if got is None:
            x1, x2 = (self.enc_x1, self.enc_x2) if comp == "encoder" else (self.llm_x1, self.llm_x2)
            j = int(np.argmax(x1))
            got = self._memo[comp] = (float(x1.mean()), float(x2.mean()), float(x1[j]), float(x2[j]))
        return got

    def work(self, cost: CostModel, tp: int = 1, cp: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Per-sample (encoder, llm) forward+backward ms without per-call constants."""
        out = []
        for comp, x1, x2, raw in (
            ("encoder", self.enc_x1, self.enc_x2, self.raw_encoder),
            ("llm", self.llm_x1, self.llm_x2, self.raw_llm),
        ):
            coeffs = layer_coefficients(cost, comp, tp, cp).sum(axis=0)
            w = coeffs[0] * x2 + coeffs[1] * x1
            out.append(np.where(np.isnan(x1), raw, w))
        return out[0], out[1]


def layer_coefficients(cost: CostModel, component: str, tp: int = 1, cp: int = 1) -> np.ndarray:
    """``[num_layers, 3]`` array of each layer's forward + backward ``(a, b, c)`` at ``(tp, cp)``,
    frozen layers' backward rules included (derived from ``CostModel.layer_ms``)."""
    key = (id(cost), component, tp, cp)
    hit = _COEFF_CACHE.get(key)
    if hit is not None and hit[0] is cost:
        return hit[1]
    rows = []
    for i in range(cost.component(component).num_layers):

        def t(units, calls, i=i):
            return sum(cost.layer_ms(component, i, units, p, tp, cp, num_calls=calls) for p in ("fwd", "bwd"))

        v1, v2 = t((1,), 0), t((2,), 0)
        a = (v2 - 2.0 * v1) / 2.0
        rows.append((a, v1 - a, t((), 1)))
    arr = np.asarray(rows, dtype=float)
    _COEFF_CACHE[key] = (cost, arr)
    return arr


_COEFF_CACHE: dict[tuple, tuple[CostModel, np.ndarray]] = {}


def _has_key(cost: CostModel, component: str, tp: int, cp: int) -> bool:
    key = parallel_key(tp, cp)
    return all(key in layer.fwd for layer in cost.component(component).layers)


# --------------------------------------------------------------------------------------------------
# Algorithm 1
# --------------------------------------------------------------------------------------------------
def num_validation_trials(alpha: float, p_error: float) -> int:
    """``k = ceil(ln(alpha) / ln(1 - p_error))`` (59 for alpha = p_error = 0.05)."""
    if not (0.0 < alpha < 1.0 and 0.0 < p_error < 1.0):
        raise ConfigError(f"alpha and p_error must be in (0, 1), got {alpha} and {p_error}")
    return math.ceil(math.log(alpha) / math.log(1.0 - p_error) - 1e-12)


def proportional_allocation(gpus_per_replica: int, encoder_share: float) -> tuple[int, int]:
    """(encoder GPUs, LLM GPUs): nearest whole GPU, ties to the LLM, each at least 1."""
    g = int(gpus_per_replica)
    if g < 2:
        raise ConfigError(f"a replica needs at least 2 GPUs (one per component), got {g}")
    enc = math.ceil(g * float(encoder_share) - 0.5)
    enc = min(max(enc, 1), g - 1)
    return enc, g - enc


def draw_seed(seed: int, batch_size: int, trial: int) -> int:
    """Seed of draw ``trial`` (0 = reference) at ``batch_size``."""
    return int(np.random.SeedSequence([int(seed), int(batch_size), int(trial)]).generate_state(1)[0])


def pool_sampler(items: Sequence[Item]) -> Sampler:
    """i.i.d. draws from a fixed list or a ``SampleTable`` (a ``TableDraw`` view then), with replacement
    (``n`` uniform indices from ``seed``)."""
    pool = items if isinstance(items, SampleTable) else list(items)
    if not len(pool):
        raise ConfigError("cannot sample from an empty dataset")

    def sample(n: int, seed: int) -> Sequence[Item]:
        idx = np.random.default_rng(seed).integers(0, len(pool), size=n)
        if isinstance(pool, SampleTable):
            return pool.take(idx)  # a lazy view: records are built only when indexed
        return [pool[i] for i in idx.tolist()]

    return sample


class MacroscopicProfiler:
    """Seeded draws of a sampler with their statistics, cached per ``(batch_size, trial)``."""

    def __init__(self, sampler: Sampler, cost: CostModel, *, seed: int = 0):
        self.sampler, self.cost, self.seed = sampler, cost, seed
        self._draws: dict[tuple[int, int], tuple[Sequence[Item], SampleStats]] = {}

    def draw(self, batch_size: int, trial: int) -> tuple[Sequence[Item], SampleStats]:
        key = (batch_size, trial)
        if key not in self._draws:
            items = self.sampler(batch_size, draw_seed(self.seed, batch_size, trial))
            if len(items) != batch_size:
                raise ConfigError(f"sampler returned {len(items)} samples, expected {batch_size}")
            self._draws[key] = (items, SampleStats.of(items))
        return self._draws[key]

    def encoder_share(self, batch_size: int, trial: int) -> float:
        return encoder_share(self.draw(batch_size, trial)[1], self.cost)


def encoder_share(stats: SampleStats, cost: CostModel) -> float:
    """The encoder's share of the samples' size-dependent work (ProportionalAllocation's input); 0.5
    when there is none (a measured profile whose tiny sizes fitted per-call constants only)."""
    enc, llm = stats.work(cost)
    total = float(enc.sum() + llm.sum())
    return float(enc.sum()) / total if total > 0 else 0.5


EQ2_TOLERANCE = 0.01
"""Algorithm 1 (ours): a validation batch agrees with the reference batch when the configuration
Algorithm 2 deploys from it, evaluated on the reference batch, has a paper Eq. 2 time within this
fraction of the reference batch's own configuration."""


@dataclass(frozen=True, slots=True)
class DeployCheck:
    """Algorithm 2's inputs, so that Algorithm 1 judges stability on the configuration that would be
    deployed (``find_b_min(deploy=...)``) and stops at the global batch."""

    global_batch: int
    microbatch_size: int
    tp: int | None = 1
    cp: int | None = 1
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
        cands = search_candidates(stats, cost, gpus=dp * sum(allocation), dp=dp, tp=deploy.tp, cp=deploy.cp,
                                  global_batch=deploy.global_batch, microbatch_size=deploy.microbatch_size,
                                  allocation=allocation)  # fmt: skip
    except ConfigError:
        return None
    return next((c for c in cands if c.memory_ok), None)


def _eq2_on(stats: SampleStats, cost: CostModel, cfg: StaticConfig) -> float:
    """Paper Eq. 2 of ``cfg``'s stages (its layer ranges as they are) on the batch ``stats``."""
    stage_ms: list[float] = []
    for comp in (cfg.encoder, cfg.llm):
        layer_ms = _mean_layer_ms(stats, cost, comp.name, comp.tp, comp.cp, cfg.microbatch_size)
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
    *,
    gpus: int,
    dp: int,
    alpha: float = 0.05,
    p_error: float = 0.05,
    n0: int = 4,
    growth: int = 2,
    seed: int = 0,
    max_batch_size: int = 1 << 16,
    extra_sizes: Sequence[int] = (),
    deploy: DeployCheck | None = None,
) -> BMinResult:
    """Algorithm 1: the smallest profiling batch size whose GPU split is stable over ``k`` draws.

    Without ``deploy``: the paper's test (every draw gives the reference split), doubling up to
    ``max_batch_size``. With ``deploy`` (what ``plan`` uses): splits whose Algorithm 2
    configurations have Eq. 2 times within ``deploy.tolerance`` count as the same, and the search
    stops at ``deploy.global_batch`` (``converged`` False and ``reason`` when it is not stable there).
    """
    if dp < 1 or gpus % dp:
        raise ConfigError(f"--gpus {gpus} is not divisible by --dp {dp}")
    if n0 < 1 or growth < 2:
        raise ConfigError(f"n0 must be >= 1 and growth >= 2, got {n0} and {growth}")
    last = deploy.global_batch if deploy is not None else max_batch_size
    if n0 > last:
        raise ConfigError(f"n0 {n0} exceeds the largest profiling batch size {last}")
    profiler = (
        sampler if isinstance(sampler, MacroscopicProfiler) else MacroscopicProfiler(sampler, cost, seed=seed)
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
    for size in extra_sizes:
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


# --------------------------------------------------------------------------------------------------
# Algorithm 2
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ComponentConfig:
    name: str
    tp: int
    cp: int
    pp: int
    layer_names: tuple[str, ...]
    layer_ranges: tuple[tuple[int, int], ...]
    stage_ms: tuple[float, ...]
    """Forward + backward ms of the mean microbatch per stage (per-call constants included)."""
    stage_memory_bytes: tuple[float, ...]
    recompute: tuple[str, ...] = ()
    """Per stage: the cheapest ``costmodel.RECOMPUTE_MODES`` entry that fits (empty: all ``none``);
    ``stage_ms`` includes its recomputation time."""

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp

    def stage_recompute(self, j: int) -> str:
        return self.recompute[j] if self.recompute else "none"

    def to_json(self) -> dict:
        return {
            "tp": self.tp,
            "cp": self.cp,
            "pp": self.pp,
            "layer_names": list(self.layer_names),
            "layers_per_stage": [list(r) for r in self.layer_ranges],
            "stage_time_ms": list(self.stage_ms),
            "stage_memory_bytes": list(self.stage_memory_bytes),
            "recompute": [self.stage_recompute(j) for j in range(len(self.layer_ranges))],
        }


@dataclass(frozen=True, slots=True)
class StaticConfig:
    """One evaluated static configuration (Algorithm 2's candidate or choice)."""

    dp: int
    microbatch_size: int
    num_microbatches: int
    gpus_per_replica: int
    allocation: tuple[int, int]
    """ProportionalAllocation's (encoder, LLM) GPU budgets M_i."""
    encoder: ComponentConfig
    llm: ComponentConfig
    predicted_iteration_time_ms: float
    """Paper Eq. 2: ``sum(stage times) + (K - 1) * slowest stage``."""
    memory_ok: bool
    device_memory_bytes: float

    @property
    def global_batch(self) -> int:
        return self.dp * self.microbatch_size * self.num_microbatches

    @property
    def components(self) -> dict[str, ComponentConfig]:
        return {"encoder": self.encoder, "llm": self.llm}

    @property
    def throughput_microbatches_per_ms(self) -> float:
        return self.dp * self.num_microbatches / self.predicted_iteration_time_ms

    @property
    def gpus_used_per_replica(self) -> int:
        return self.encoder.gpus + self.llm.gpus

    def sort_key(self) -> tuple:
        e, m = self.encoder, self.llm
        return (
            self.predicted_iteration_time_ms,
            self.gpus_used_per_replica * self.dp,
            self.dp,
            e.tp,
            e.cp,
            e.pp,
            m.tp,
            m.cp,
            m.pp,
        )

    def to_layout(self) -> Layout:
        """Disjoint encoder-then-LLM stages, one stage per pipeline rank."""
        stages, s = [], 0
        for comp in (self.encoder, self.llm):
            for j, (first, end) in enumerate(comp.layer_ranges):
                stages.append(StageSpec(s, comp.name, first, end, s, comp.stage_recompute(j)))
                s += 1
        return Layout(
            dp=self.dp,
            microbatch_size=self.microbatch_size,
            num_microbatches=self.num_microbatches,
            components={c.name: ComponentLayout(c.tp, c.cp, c.pp) for c in (self.encoder, self.llm)},
            stages=tuple(stages),
        )

    def to_json(self) -> dict:
        """The ``config`` object of ``entrain plan --json`` (CONTRACT.md) plus extra keys."""
        return {
            "dp": self.dp,
            "microbatch_size": self.microbatch_size,
            "num_microbatches": self.num_microbatches,
            "gpus_per_replica": self.gpus_per_replica,
            "allocation": list(self.allocation),
            "components": {"encoder": self.encoder.to_json(), "llm": self.llm.to_json()},
            "memory_ok": self.memory_ok,
        }


def _mean_layer_ms(stats: SampleStats, cost: CostModel, comp: str, tp: int, cp: int, u: int) -> np.ndarray:
    """Per-layer forward + backward ms of a microbatch of ``u`` mean samples (constants included)."""
    coeffs = layer_coefficients(cost, comp, tp, cp)
    if stats.has_tokens:
        mean_x1, mean_x2 = stats.column_summary(comp)[:2]
        var = coeffs[:, 0] * mean_x2 + coeffs[:, 1] * mean_x1
    else:  # raw work: spread the mean work over the layers by their linear costs
        enc, llm = stats.work(cost, 1, 1)
        mean_work = float((enc if comp == "encoder" else llm).mean())
        ref = layer_coefficients(cost, comp, 1, 1)[:, 1]
        scale = coeffs[:, 1].sum() / max(ref.sum(), 1e-300)
        var = mean_work * scale * coeffs[:, 1] / max(coeffs[:, 1].sum(), 1e-300)
    mean_tokens = u * mean_x1 if stats.has_tokens else 0.0
    return cost.small_call_factor(comp, mean_tokens) * u * var + coeffs[:, 2]


@dataclass(frozen=True, slots=True)
class MicrobatchLoad:
    """What a stage plans for: a mean microbatch's tokens (and squared unit lengths) on one component,
    held ``in_flight`` times, and the largest microbatch's, which a recomputing backward expands."""

    tokens: float
    tokens_sq: float
    peak_tokens: float
    peak_tokens_sq: float


def _microbatch_load(stats: SampleStats, comp: str, microbatch_size: int) -> MicrobatchLoad:
    """Mean microbatch = ``microbatch_size`` mean samples; largest = ``microbatch_size`` copies of the
    profile's largest sample on ``comp`` (0 for raw-work profiles: no token metadata)."""
    if not stats.has_tokens:
        return MicrobatchLoad(0.0, 0.0, 0.0, 0.0)
    mean_x1, mean_x2, peak_x1, peak_x2 = stats.column_summary(comp)
    u = microbatch_size
    return MicrobatchLoad(u * mean_x1, u * mean_x2, u * peak_x1, u * peak_x2)


def _params_bytes(cost: CostModel, comp: str, first: int, end: int, tp: int) -> float:
    def compute() -> float:
        layers = cost.component(comp).layers[first:end]
        factor = ADAM_BYTES_PER_BF16_WEIGHT_BYTE
        return sum(layer.param_bytes * (factor if layer.trainable else 1.0) for layer in layers) / tp

    return _cost_memo(cost, ("params", comp, first, end, tp), compute)


_COST_MEMO: dict[tuple, tuple[CostModel, object]] = {}
_COST_MEMO_MAX_ENTRIES = 200_000


def _cost_memo(cost: CostModel, key: tuple, compute: Callable[[], object]):
    """``compute()`` once per cost model and ``key``: what Algorithm 2 asks the cost model again and
    again for the same stage (model state, kept bytes, recomputation coefficients)."""
    full = (id(cost), *key)
    hit = _COST_MEMO.get(full)
    if hit is not None and hit[0] is cost:
        return hit[1]
    if len(_COST_MEMO) >= _COST_MEMO_MAX_ENTRIES:
        _COST_MEMO.clear()
    value = compute()
    _COST_MEMO[full] = (cost, value)
    return value


def stage_memory_bytes(
    cost: CostModel, comp: str, first: int, end: int, tp: int, cp: int, load: MicrobatchLoad, in_flight: int,
    recompute: str = "none",
) -> float:  # fmt: skip
    """One GPU of a stage: model state (weights + gradients + Adam states of trainable layers, bf16
    weights of frozen ones, / TP) + ``in_flight`` mean microbatches' kept activations + the largest
    microbatch's recomputation transient (``CostModel.recompute_transient_bytes``), / (TP x CP)."""
    lin, sq = _cost_memo(cost, ("kept", comp, first, end, recompute),
                         lambda: cost.kept_bytes_per_token(comp, first, end, recompute))  # fmt: skip
    held = in_flight * (load.tokens * lin + load.tokens_sq * sq)
    dropped = _cost_memo(cost, ("dropped", comp, first, end, recompute),
                         lambda: cost.recompute_dropped_bytes_per_token(comp, first, end, recompute))  # fmt: skip
    # CostModel.recompute_transient_bytes on the cached per-layer coefficients
    transient = max([0.0, *(lin * load.peak_tokens + sq * load.peak_tokens_sq for lin, sq in dropped)])
    return _params_bytes(cost, comp, first, end, tp) + (held + transient) / (tp * cp)


def _recompute_ms(
    stats: SampleStats, cost: CostModel, comp: str, first: int, end: int, tp: int, cp: int, u: int, mode: str
) -> float:
    """Recomputation ms of a mean ``u``-sample microbatch on layers ``[first, end)`` (one call)."""
    if mode == "none" or not stats.has_tokens:
        return 0.0
    mean_x1, mean_x2 = stats.column_summary(comp)[:2]
    total = 0.0
    for a, b, c in _recompute_coefficients(cost, comp, first, end, tp, cp, mode):
        total += u * (a * mean_x2 + b * mean_x1) + c
    return total


def _recompute_coefficients(cost: CostModel, comp: str, first: int, end: int, tp: int, cp: int, mode: str):
    """Per layer of ``[first, end)``: the ``(a, b, c)`` of its recomputation ms (``CostModel.recompute_ms``
    at 1 and 2 units, and one call's constant), cached per cost model."""

    def compute() -> tuple[tuple[float, float, float], ...]:
        out = []
        for i in range(first, end):
            g1 = cost.recompute_ms(comp, i, (1,), mode, tp, cp, 0)
            g2 = cost.recompute_ms(comp, i, (2,), mode, tp, cp, 0)
            a = (g2 - 2.0 * g1) / 2.0
            out.append((a, g1 - a, cost.recompute_ms(comp, i, (), mode, tp, cp, 1)))
        return tuple(out)

    return _cost_memo(cost, ("recompute", comp, first, end, tp, cp, mode), compute)


def choose_recompute(
    stats: SampleStats, cost: CostModel, comp: str, first: int, end: int, tp: int, cp: int, u: int,
    in_flight: int, limit_bytes: float,
) -> tuple[str, float, float]:  # fmt: skip
    """(mode, memory bytes, recomputation ms) of the cheapest ``RECOMPUTE_MODES`` entry whose stage
    memory fits ``limit_bytes``; ``full`` (not fitting) when none does."""
    load = _microbatch_load(stats, comp, u)
    for mode in RECOMPUTE_MODES:
        mem = stage_memory_bytes(cost, comp, first, end, tp, cp, load, in_flight, mode)
        if mem <= limit_bytes or mode == RECOMPUTE_MODES[-1]:
            return mode, mem, _recompute_ms(stats, cost, comp, first, end, tp, cp, u, mode)
    raise AssertionError("unreachable")


def evaluate_config(
    profile: Sequence[Item] | SampleStats,
    cost: CostModel,
    *,
    dp: int,
    encoder: tuple[int, int, int],
    llm: tuple[int, int, int],
    global_batch: int,
    microbatch_size: int,
    gpus_per_replica: int | None = None,
    allocation: tuple[int, int] | None = None,
) -> StaticConfig:
    """Evaluate one configuration: ``encoder`` / ``llm`` = (tp, cp, pp); min-max partition per
    component, Eq. 2 time and the memory check. ConfigError if the batch is not divisible by
    ``dp * microbatch_size`` or a component has fewer layers than stages."""
    stats = profile if isinstance(profile, SampleStats) else SampleStats.of(profile)
    if len(stats) == 0:
        raise ConfigError("the profile has no samples")
    u = int(microbatch_size)
    k = num_microbatches(global_batch, dp, u)
    limit = cost.hardware.device_memory_bytes
    degrees = {"encoder": encoder, "llm": llm}
    num_stages = encoder[2] + llm[2]
    comps, first = {}, 0
    for comp in COMPONENTS:
        tp, cp, pp = degrees[comp]
        if not _has_key(cost, comp, tp, cp):
            raise ConfigError(f"the cost model has no {comp} costs for tp={tp} cp={cp}")
        layer_ms = _mean_layer_ms(stats, cost, comp, tp, cp, u)
        part = min_max_partition(layer_ms.tolist(), pp)
        chosen = [
            choose_recompute(stats, cost, comp, f, e, tp, cp, u, num_stages - (first + j), limit)
            for j, (f, e) in enumerate(part.ranges)
        ]
        comps[comp] = ComponentConfig(
            comp, tp, cp, pp, tuple(cost.component(comp).layer_names), part.ranges,
            tuple(t + c[2] for t, c in zip(part.stage_ms, chosen)), tuple(c[1] for c in chosen),
            tuple(c[0] for c in chosen),
        )  # fmt: skip
        first += pp
    stage_ms = comps["encoder"].stage_ms + comps["llm"].stage_ms
    t_iter = sum(stage_ms) + (k - 1) * max(stage_ms)
    mem_ok = all(m <= limit for c in comps.values() for m in c.stage_memory_bytes)
    g = gpus_per_replica if gpus_per_replica is not None else comps["encoder"].gpus + comps["llm"].gpus
    alloc = allocation if allocation is not None else (comps["encoder"].gpus, comps["llm"].gpus)
    return StaticConfig(dp, u, k, g, alloc, comps["encoder"], comps["llm"], t_iter, mem_ok, limit)


def _component_options(cost: CostModel, comp: str, budget: int, tp: int | None, cp: int | None):
    tps = [tp] if tp is not None else [1, 2, 4, 8]
    cps = [cp] if cp is not None else [1, 2]
    n_layers = cost.component(comp).num_layers
    out = []
    for t in tps:
        for c in cps:
            if not _has_key(cost, comp, t, c):
                continue
            # floor and ceil of the budget; more stages than layers is clamped to one layer a stage
            for pp in sorted({min(budget // (t * c), n_layers), min(-(-budget // (t * c)), n_layers)}):
                if pp >= 1 and (t, c, pp) not in out:
                    out.append((t, c, pp))
    return out


def _dp_options(gpus: int, dp: int | None, global_batch: int, microbatch_size: int) -> list[int]:
    if dp is not None:
        if dp < 1 or gpus % dp:
            raise ConfigError(f"--gpus {gpus} is not divisible by --dp {dp}")
        if gpus // dp < 2:
            raise ConfigError(f"--gpus {gpus} / --dp {dp} leaves fewer than 2 GPUs per replica")
        num_microbatches(global_batch, dp, microbatch_size)
        return [dp]
    out = [d for d in range(1, gpus // 2 + 1) if gpus % d == 0 and global_batch % (d * microbatch_size) == 0]
    if not out:
        raise ConfigError(
            f"no DP degree divides both --gpus {gpus} (>= 2 GPUs per replica) and the global batch "
            f"{global_batch} / microbatch size {microbatch_size}"
        )
    return out


def search_candidates(
    profile: Sequence[Item] | SampleStats,
    cost: CostModel,
    *,
    gpus: int,
    dp: int | None = None,
    tp: int | None = 1,
    cp: int | None = 1,
    global_batch: int,
    microbatch_size: int,
    allocation: tuple[int, int] | None = None,
) -> list[StaticConfig]:
    """Every candidate Algorithm 2 visits (feasible or not), best first (``StaticConfig.sort_key``,
    infeasible ones last). ``tp``/``cp`` = None searches {1, 2, 4, 8} / {1, 2} per component.
    ``allocation`` = the (encoder, LLM) GPU budgets per replica instead of ProportionalAllocation's."""
    stats = profile if isinstance(profile, SampleStats) else SampleStats.of(profile)
    share = encoder_share(stats, cost)
    out = []
    for d in _dp_options(gpus, dp, global_batch, microbatch_size):
        g = gpus // d
        m_enc, m_llm = allocation if allocation is not None else proportional_allocation(g, share)
        for e in _component_options(cost, "encoder", m_enc, tp, cp):
            for m in _component_options(cost, "llm", m_llm, tp, cp):
                if e[0] * e[1] * e[2] + m[0] * m[1] * m[2] > g:
                    continue
                out.append(
                    evaluate_config(
                        stats,
                        cost,
                        dp=d,
                        encoder=e,
                        llm=m,
                        global_batch=global_batch,
                        microbatch_size=microbatch_size,
                        gpus_per_replica=g,
                        allocation=(m_enc, m_llm),
                    )
                )
    out.sort(key=lambda c: (not c.memory_ok, c.sort_key()))
    return out


def search_config(
    profile: Sequence[Item] | SampleStats,
    cost: CostModel,
    *,
    gpus: int,
    dp: int | None = None,
    tp: int | None = 1,
    cp: int | None = 1,
    global_batch: int,
    microbatch_size: int,
) -> StaticConfig:
    """Algorithm 2: the best feasible static configuration for the profile batch."""
    cands = search_candidates(
        profile,
        cost,
        gpus=gpus,
        dp=dp,
        tp=tp,
        cp=cp,
        global_batch=global_batch,
        microbatch_size=microbatch_size,
    )
    if not cands:
        raise ConfigError(
            f"no configuration fits: --gpus {gpus}, --dp {dp}, --tp {tp} leave no TP x CP x PP factorisation "
            "within each component's GPU budget"
        )
    best = cands[0]
    if not best.memory_ok and cp == 1 and any(_has_key(cost, "encoder", t, 2) for t in (1, 2, 4, 8)):
        # context parallelism where a single sample's patches overflow a stage even with recomputation
        wider = search_candidates(
            profile,
            cost,
            gpus=gpus,
            dp=dp,
            tp=tp,
            cp=None,
            global_batch=global_batch,
            microbatch_size=microbatch_size,
        )
        if wider and wider[0].memory_ok:
            return wider[0]
    if not best.memory_ok:
        stats = profile if isinstance(profile, SampleStats) else SampleStats.of(profile)
        raise ConfigError(no_fit_message(best, stats, gpus=gpus))
    return best


def no_fit_message(best: StaticConfig, stats: SampleStats, *, gpus: int) -> str:
    """One line: what the best candidate needs, the largest sample of the component that overflows,
    and what would make it fit (GPUs, ``--max-pixels``, a smaller microbatch; recomputation is
    already at its strongest where needed)."""
    limit = best.device_memory_bytes
    comp = max(best.components.values(), key=lambda c: max(c.stage_memory_bytes))
    worst = max(comp.stage_memory_bytes)
    j = comp.stage_memory_bytes.index(worst)
    f, e = comp.layer_ranges[j]
    head = (
        f"no configuration fits in device memory ({limit / 1e9:.1f} GB): the best candidate's {comp.name} stage "
        f"{j} (layers [{f}, {e}), tp {comp.tp} cp {comp.cp}, recompute {comp.stage_recompute(j)}) needs "
        f"{worst / 1e9:.1f} GB"
    )
    if not stats.has_tokens:
        return f"{head}; use more GPUs (--gpus {2 * gpus}) or a smaller --microbatch-size"
    x1 = stats.enc_x1 if comp.name == "encoder" else stats.llm_x1
    k = int(np.argmax(x1))
    unit = "ViT patches" if comp.name == "encoder" else "LLM tokens"
    need = worst / limit
    pixels = ""
    if comp.name == "encoder":
        pixels = (
            f", --max-pixels about {int(x1[k] * 196 / max(need, 1.0) / 784) * 784} (a smaller largest image)"
        )
    return (
        f"{head}; the largest sample is {stats.ids[k]!r} ({int(x1[k])} {unit}); to fit: about {need:.1f}x the "
        f"GPUs per replica (--gpus {int(2 ** math.ceil(math.log2(max(need, 1.0) * 1.0001)) * gpus)}), "
        f"--microbatch-size 1{pixels}; recomputation is already full on that stage"
    )


@dataclass(frozen=True, slots=True)
class PlanResult:
    """Algorithm 1 + Algorithm 2 for one run: the b_min search (of the chosen DP) and the config."""

    b_min: BMinResult
    config: StaticConfig
    per_dp: dict[int, tuple[BMinResult, StaticConfig]] = field(default_factory=dict)


def plan(
    sampler: Sampler,
    cost: CostModel,
    *,
    gpus: int,
    dp: int | None = None,
    tp: int | None = 1,
    cp: int | None = 1,
    global_batch: int,
    microbatch_size: int,
    alpha: float = 0.05,
    p_error: float = 0.05,
    n0: int = 4,
    seed: int = 0,
    extra_sizes: Sequence[int] = (),
    tolerance: float = EQ2_TOLERANCE,
) -> PlanResult:
    """Find ``b_min`` (per DP visited when ``dp`` is None; stability judged on the deployed
    configuration, ``DeployCheck``, up to the global batch) and search the configuration from the
    reference batch drawn at ``b_min``; the result is the DP with the best Eq. 2 time."""
    profiler = MacroscopicProfiler(sampler, cost, seed=seed)
    deploy = DeployCheck(global_batch, microbatch_size, tp, cp, tolerance)
    per_dp = {}
    last_error: ConfigError | None = None
    for d in _dp_options(gpus, dp, global_batch, microbatch_size):
        bmin = find_b_min(
            profiler, cost, gpus=gpus, dp=d, alpha=alpha, p_error=p_error, n0=min(n0, global_batch),
            extra_sizes=extra_sizes, deploy=deploy,
        )  # fmt: skip
        _, stats = profiler.draw(bmin.b_min, 0)
        try:
            cfg = search_config(
                stats,
                cost,
                gpus=gpus,
                dp=d,
                tp=tp,
                cp=cp,
                global_batch=global_batch,
                microbatch_size=microbatch_size,
            )
        except ConfigError as err:
            if dp is not None:
                raise
            last_error = err
            continue
        per_dp[d] = (bmin, cfg)
    if not per_dp:
        raise ConfigError(f"no DP degree yields a feasible configuration on {gpus} GPUs; e.g. {last_error}")
    best = min(per_dp, key=lambda d: per_dp[d][1].sort_key())
    return PlanResult(per_dp[best][0], per_dp[best][1], per_dp)


MEMORY_CHECK_REPLICA_ITERATIONS = 80
"""(replica, iteration) pairs the plan's simulated memory check needs to see: what ``--iterations 20``
gives on the paper's DP 4 (docs/planning_scale.md)."""


def memory_check_iterations(
    dp: int, iterations: int, replica_iterations: int = MEMORY_CHECK_REPLICA_ITERATIONS
) -> int:
    """Global batches the plan's simulated memory check draws: the fewest that hold at least
    ``replica_iterations`` (replica, iteration) pairs, at most ``iterations`` and at least 1.

    Each pair is an exchangeable draw of a replica's microbatches, so the chance that a fresh pair
    peaks above every one of ``R`` simulated pairs is at most ``1 / (R + 1)``: with ``R`` >= 80 the
    check keeps the guarantee it has on the paper's setup (20 iterations of 4 replicas) while
    simulating 2 global batches instead of 20 at DP 64."""
    return max(1, min(int(iterations), -(-int(replica_iterations) // max(int(dp), 1))))


# --------------------------------------------------------------------------------------------------
# Baselines' configurations
# --------------------------------------------------------------------------------------------------
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
    ("synthchartnet", "qwen25vl-llama3-1b"): {"disttrain": (4, 4), "dip": (8, 8), "entrain": (5, 3)},
    ("synthchartnet", "qwen25vl-llama3-3b"): {"disttrain": (5, 3), "dip": (8, 8), "entrain": (4, 4)},
    ("llava150k", "qwen25vl-llama3-1b"): {"disttrain": (5, 3), "dip": (8, 8), "entrain": (4, 4)},
    ("chartqa", "qwen25vl-llama3-1b"): {"disttrain": (5, 3), "dip": (8, 8), "entrain": (5, 3)},
    ("cocoqa", "qwen25vl-llama3-1b"): {"disttrain": (4, 4), "dip": (8, 8), "entrain": (5, 3)},
    ("llava150k", "qwen25vl-llama3-3b"): {"disttrain": (4, 4), "dip": (8, 8), "entrain": (3, 5)},
    ("chartqa", "qwen25vl-llama3-3b"): {"disttrain": (4, 4), "dip": (8, 8), "entrain": (4, 4)},
    ("cocoqa", "qwen25vl-llama3-3b"): {"disttrain": (4, 4), "dip": (8, 8), "entrain": (3, 5)},
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
    system: str = "disttrain",
    global_batch: int = PAPER_GLOBAL_BATCH,
    microbatch_size: int = PAPER_MICROBATCH,
) -> StaticConfig:
    """Table 1's (E.PP, L.PP) for ``system`` with TP 2, DP 4; layer ranges by the min-max DP on
    ``profile`` (DistTrain: its one-sample profile). ConfigError for pairs the table lacks."""
    key = (_PAPER_DATASET_ALIASES.get(dataset, dataset), model)
    if key not in PAPER_TABLE1:
        known = ", ".join(f"{d}/{m}" for d, m in PAPER_TABLE1)
        raise ConfigError(f"paper Table 1 has no configuration for {dataset}/{model}; it covers {known}")
    if system not in ("disttrain", "entrain"):
        raise ConfigError(f"Table 1 disjoint-stage configs exist for disttrain and entrain, not {system!r}")
    e_pp, l_pp = PAPER_TABLE1[key][system]
    return evaluate_config(
        profile,
        cost,
        dp=PAPER_DP,
        encoder=(PAPER_TP, 1, e_pp),
        llm=(PAPER_TP, 1, l_pp),
        global_batch=global_batch,
        microbatch_size=microbatch_size,
    )


_PAPER_DATASET_ALIASES = {"llava_instruct_150k": "llava150k"}


def dip_layout(
    profile: Sequence[Item] | SampleStats,
    cost: CostModel,
    *,
    dp: int,
    pp: int,
    global_batch: int,
    microbatch_size: int,
    tp: int = 1,
    cp: int = 1,
) -> Layout:
    """DIP-like colocated layout: pipeline rank ``r`` of a replica holds encoder chunk ``r`` (stage
    ``r``) and LLM chunk ``r`` (stage ``pp + r``); each modality is split over all ``pp`` ranks by
    the min-max DP on ``profile`` (DIP: its 4-sample profile)."""
    cfg = evaluate_config(
        profile,
        cost,
        dp=dp,
        encoder=(tp, cp, pp),
        llm=(tp, cp, pp),
        global_batch=global_batch,
        microbatch_size=microbatch_size,
    )
    stages = [StageSpec(r, "encoder", f, e, r) for r, (f, e) in enumerate(cfg.encoder.layer_ranges)]
    stages += [StageSpec(pp + r, "llm", f, e, r) for r, (f, e) in enumerate(cfg.llm.layer_ranges)]
    return Layout(
        dp=dp,
        microbatch_size=microbatch_size,
        num_microbatches=cfg.num_microbatches,
        components={"encoder": ComponentLayout(tp, cp, pp), "llm": ComponentLayout(tp, cp, pp)},
        stages=tuple(stages),
    )


# --------------------------------------------------------------------------------------------------
# Extension: boundary sharing (not in the paper)
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SharedBoundaryConfig:
    """Entrain's boundary-sharing layout: the ``ranks`` pipeline ranks of a replica cover the
    concatenated layer list (encoder layers, then LLM layers) by one min-max partition, so the rank
    where the modalities meet may hold the last encoder stage *and* the first LLM stage."""

    layout: Layout
    rank_ms: tuple[float, ...]
    """Forward + backward ms of the mean microbatch per pipeline rank (per-call constants included)."""
    rank_memory_bytes: tuple[float, ...]
    predicted_iteration_time_ms: float
    """Paper Eq. 2 over the ranks: ``sum(rank times) + (K - 1) * slowest rank``."""
    memory_ok: bool

    @property
    def shares_boundary(self) -> bool:
        return len(self.layout.stages) > self.layout.ranks_per_replica


def boundary_sharing_config(
    profile: Sequence[Item] | SampleStats,
    cost: CostModel,
    *,
    dp: int,
    ranks: int,
    tp: int,
    cp: int = 1,
    global_batch: int,
    microbatch_size: int,
) -> SharedBoundaryConfig:
    """One min-max partition (``partition.min_max_partition``) of the mean microbatch's per-layer
    forward + backward ms over the concatenated encoder-then-LLM layer list into ``ranks`` ranks
    (both components at the same ``tp`` x ``cp``, so a rank's GPUs can hold either). A rank whose
    range crosses the boundary gets two stages. Memory per rank as Algorithm 2's check."""
    stats = profile if isinstance(profile, SampleStats) else SampleStats.of(profile)
    if len(stats) == 0:
        raise ConfigError("the profile has no samples")
    u = int(microbatch_size)
    num_microbatches(global_batch, dp, u)
    for comp in COMPONENTS:
        if not _has_key(cost, comp, tp, cp):
            raise ConfigError(f"the cost model has no {comp} costs for tp={tp} cp={cp}")
    enc_ms = _mean_layer_ms(stats, cost, "encoder", tp, cp, u)
    llm_ms = _mean_layer_ms(stats, cost, "llm", tp, cp, u)
    n_enc = len(enc_ms)
    part = min_max_partition([*enc_ms.tolist(), *llm_ms.tolist()], ranks)
    pieces: list[tuple[str, int, int, int]] = []  # (component, first, end, rank)
    for r, (f, e) in enumerate(part.ranges):
        if f < n_enc:
            pieces.append(("encoder", f, min(e, n_enc), r))
        if e > n_enc:
            pieces.append(("llm", max(f, n_enc) - n_enc, e - n_enc, r))
    pieces.sort(key=lambda p: (p[0] != "encoder", p[1]))
    stages = tuple(StageSpec(i, c, f, e, r) for i, (c, f, e, r) in enumerate(pieces))
    num_enc = sum(1 for p in pieces if p[0] == "encoder")
    k = global_batch // (dp * u)
    layout = Layout(
        dp=dp,
        microbatch_size=u,
        num_microbatches=k,
        components={
            "encoder": ComponentLayout(tp, cp, num_enc),
            "llm": ComponentLayout(tp, cp, len(pieces) - num_enc),
        },
        stages=stages,
    )
    limit = cost.hardware.device_memory_bytes
    memory, rank_ms = [0.0] * ranks, list(part.stage_ms)
    modes: dict[int, str] = {}
    for r in range(ranks):  # one recomputation mode per rank: the cheapest that fits all its pieces
        mine = [p for p in pieces if p[3] == r]
        for mode in RECOMPUTE_MODES:
            mem = sum(
                stage_memory_bytes(cost, c, f, e, tp, cp, _microbatch_load(stats, c, u), ranks - r, mode)
                for c, f, e, _ in mine
            )
            if mem <= limit or mode == RECOMPUTE_MODES[-1]:
                break
        modes[r], memory[r] = mode, mem
        rank_ms[r] += sum(_recompute_ms(stats, cost, c, f, e, tp, cp, u, mode) for c, f, e, _ in mine)
    stages = tuple(replace(st, recompute=modes[st.pp_rank]) for st in stages)
    layout = replace(layout, stages=stages)
    t_iter = sum(rank_ms) + (k - 1) * max(rank_ms)
    ok = all(m <= limit for m in memory)
    return SharedBoundaryConfig(layout, tuple(rank_ms), tuple(memory), t_iter, ok)
