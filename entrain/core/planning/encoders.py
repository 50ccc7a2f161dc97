"""Planning with N encoders (vision, audio, ...) feeding one LLM: the planner half, as pure functions.

docs/design.md, "N encoders", is the design. In short: each encoder is its own component with its
own pipeline group (TP, CP, stages), the LLM receives every encoder's output, and a replica's GPUs
are split among all of them.

* ``Encoder``: one encoder's name, its cost model (whose ``encoder`` component holds this encoder's
  layers and whose ``llm`` is the shared LLM) and its sequence units per sample (``vision_units``:
  images' patches and videos' frames; ``audio_units``: audio clips' attention chunks).
* ``audio_tower_specs`` / ``price_encoder``: a Whisper-style audio tower priced from its layer specs
  by the same device model and hardware preset as the vision tower (the one-encoder cost model prices
  it from the same specs, run in the first encoder layer: ``LayerCost.audio``).
* ``encoder_works``: per-sample, per-encoder forward + backward work (``EncoderWork``), the input of
  the allocation and of ``assignment.multi_encoder``.
* ``allocate_gpus``: Algorithm 1's proportional allocation for N + 1 components: every component at
  least one GPU, the rest handed out so that the largest work per GPU is least.
* ``find_b_min_encoders``: Algorithm 1's doubling with the paper's test on allocation vectors.
* ``search_encoders``: Algorithm 2 for N encoders: per component every (TP, CP, PP) within its
  budget, each evaluated by ``config_search.evaluate_config`` (unchanged), combined by the N-encoder
  Eq. 2 (``eq2_ms``), best first.

Nothing here changes a one-encoder plan: the planner's existing path does not call this module.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from entrain.core.assignment.multi_encoder import EncoderWork
from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.presets import build_cost_model
from entrain.core.costs.sampler import Sampler, SampleStats, draw_seed, has_costs
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.model.layer_specs import LayerSpec
from entrain.core.model.omni import QWEN25_OMNI_7B_AUDIO, AudioTower, EncoderSwapped, audio_tower_specs
from entrain.core.planning.bmin import PAPER_BMIN_CONFIG, BMinConfig, num_validation_trials
from entrain.core.planning.config_search import ComponentConfig, dp_options, evaluate_config, gpus_of
from entrain.core.workload.samples import SampleMeta

__all__ = [
    "AudioTower",
    "QWEN25_OMNI_7B_AUDIO",
    "Encoder",
    "shape_encoders",
    "vision_units",
    "audio_units",
    "audio_tower_specs",
    "price_encoder",
    "encoder_stats",
    "encoder_works",
    "component_totals",
    "allocate_gpus",
    "max_work_per_gpu",
    "eq2_ms",
    "MultiEncoderConfig",
    "search_encoders",
    "EncodersTrial",
    "EncodersBMin",
    "find_b_min_encoders",
]


# --- sequence units per encoder ---------------------------------------------------------------------
def vision_units(sample: SampleMeta) -> tuple[int, ...]:
    """The vision tower's units of a sample (``SampleMeta.vision_units``: its images' patches, then its
    videos' frames), the one rule the one-encoder cost model and column statistics read too."""
    return sample.vision_units


def audio_units(sample: SampleMeta) -> tuple[int, ...]:
    """The audio tower's units of a sample (``SampleMeta.audio_units``: its clips' attention chunks)."""
    return sample.audio_units


# the audio tower's layer specs: ``model.omni.audio_tower_specs`` (the one-encoder cost model prices the audio
# tower from them too, ``costs.presets.build_cost_model``)


def price_encoder(
    shape,
    specs: Sequence[LayerSpec],
    hardware: str,
    *,
    freeze: Iterable[str] = (),
    attention: str | None = None,
) -> CostModel:
    """The cost model of ``shape`` (a ``ModelShape``) with ``specs`` as its encoder, on the hardware
    preset ``hardware``: the encoder is priced by the device model that prices ``shape``'s own encoder
    (the same rates, per-call constants spread over its own layers), the LLM is ``shape``'s."""
    return build_cost_model(EncoderSwapped(shape, specs), hardware, freeze=freeze, attention=attention)


# --- encoders and their work ------------------------------------------------------------------------
@dataclass(frozen=True)
class Encoder:
    """One encoder component: ``cost.encoder`` are its layers (``cost.llm`` the shared LLM) and
    ``units`` its sequence units of a sample."""

    name: str
    cost: CostModel
    units: Callable[[SampleMeta], tuple[int, ...]]


def shape_encoders(
    shape, hardware: str, *, freeze: Iterable[str] = (), attention: str | None = None
) -> tuple[Encoder, ...] | None:
    """The encoders of a model shape with an audio tower beside its vision tower (``shape.arch``: the
    ``ModelArch`` of vision tower and LLM, ``shape.audio``: an ``AudioTower``'s fields, e.g. the
    Omni family's ``OmniShape``): ``vision`` priced from ``shape.arch`` and ``audio`` by
    ``price_encoder``, both on ``hardware``; None for a shape with one encoder."""
    audio = getattr(shape, "audio", None)
    if audio is None:
        return None
    freeze = tuple(freeze)
    vision = build_cost_model(shape.arch, hardware, freeze=freeze, attention=attention)
    heard = price_encoder(shape.arch, audio_tower_specs(audio), hardware, freeze=freeze, attention=attention)
    return Encoder("vision", vision, vision_units), Encoder("audio", heard, audio_units)


def _metas(samples: Sequence) -> list[SampleMeta]:
    out = []
    for s in samples:
        meta = s if isinstance(s, SampleMeta) else getattr(s, "meta", None)
        if meta is None:
            raise ConfigError(
                f"sample {s.id!r}: planning with several encoders needs token metadata (images, audio, text "
                "tokens); a raw-work file gives one encoder's work only"
            )
        out.append(meta)
    return out


def _check_encoders(encoders: Sequence[Encoder]) -> None:
    if not encoders:
        raise ConfigError("planning needs at least one encoder")
    names = [e.name for e in encoders]
    if len(set(names)) != len(names) or "llm" in names:
        raise ConfigError(f"encoder names {names}: need distinct names other than 'llm'")


def encoder_stats(samples: Sequence, encoder: Encoder) -> SampleStats:
    """Column statistics of ``samples`` with ``encoder``'s units as the encoder columns (the LLM
    columns are the samples' LLM tokens): what ``config_search`` evaluates ``encoder.cost`` on."""
    metas = _metas(samples)
    cols = np.zeros((4, len(metas)))
    for j, meta in enumerate(metas):
        units = encoder.units(meta)
        cols[0, j] = sum(units)
        cols[1, j] = sum(u * u for u in units)
        cols[2, j] = meta.llm_tokens
        cols[3, j] = float(meta.llm_tokens) ** 2
    nan = np.full(len(metas), np.nan)
    return SampleStats(tuple(m.id for m in metas), *cols, nan, nan.copy())


def encoder_works(samples: Sequence, encoders: Sequence[Encoder]) -> list[EncoderWork]:
    """Per sample, forward + backward ms of each whole encoder and of the LLM at TP = CP = 1, per-call
    constants excluded (``SampleStats.work``, the numbers Algorithm 1's split uses today); the LLM's
    from the first encoder's cost model."""
    _check_encoders(encoders)
    metas = _metas(samples)
    stats = [encoder_stats(metas, e) for e in encoders]
    enc = np.array([s.work(e.cost)[0] for s, e in zip(stats, encoders)]).reshape(len(encoders), len(metas))
    llm = stats[0].work(encoders[0].cost)[1]
    return [
        EncoderWork(m.id, tuple(float(x) for x in enc[:, j]), float(llm[j]), m) for j, m in enumerate(metas)
    ]


def component_totals(works: Sequence[EncoderWork]) -> tuple[float, ...]:
    """Summed work of each encoder, then the LLM's (the allocation's input)."""
    if not works:
        raise ConfigError("no samples to allocate GPUs by")
    n = len(works[0].encoders)
    return tuple(float(np.sum([w.encoders[e] for w in works])) for e in range(n)) + (
        float(np.sum([w.llm for w in works])),
    )


# --- Algorithm 1's allocation, N + 1 components ---------------------------------------------------------
def allocate_gpus(gpus_per_replica: int, totals: Sequence[float]) -> tuple[int, ...]:
    """GPUs per component (encoders in order, the LLM last) of a replica's ``gpus_per_replica``: each
    component at least one, the rest one at a time to the component with the largest work per GPU
    (ties: the LLM, then the lowest encoder index). The result minimises the largest ``work / GPUs``
    over all splits (the greedy step is optimal for this bottleneck objective); with two components it
    may differ from the paper's nearest-GPU rounding (``sampler.proportional_allocation``), which the
    one-encoder planner keeps."""
    g, n = int(gpus_per_replica), len(totals)
    if n < 2:
        raise ConfigError(f"need an encoder and the LLM to split GPUs among, got {n} component(s)")
    if any(not np.isfinite(t) or t < 0 for t in totals):
        raise ConfigError(f"component work {list(totals)}: need finite, non-negative numbers")
    if g < n:
        raise ConfigError(f"a replica needs at least {n} GPUs (one per component), got {g}")
    alloc = [1] * n
    # heap key: (-work per GPU, LLM first, then the lowest index)
    heap = [(-float(t), 0 if i == n - 1 else 1, i) for i, t in enumerate(totals)]
    heapq.heapify(heap)
    for _ in range(g - n):
        _, rank, i = heapq.heappop(heap)
        alloc[i] += 1
        heapq.heappush(heap, (-float(totals[i]) / alloc[i], rank, i))
    return tuple(alloc)


def max_work_per_gpu(totals: Sequence[float], allocation: Sequence[int]) -> float:
    """The bottleneck the allocation minimises: ``max(work / GPUs)`` over the components."""
    return max(t / a for t, a in zip(totals, allocation))


# --- Algorithm 2, N encoders ----------------------------------------------------------------------------
def eq2_ms(encoder_stage_ms: Sequence[Sequence[float]], llm_stage_ms: Sequence[float], k: int) -> float:
    """Eq. 2 for encoder pipelines side by side feeding one LLM pipeline: the longest path through the
    stages (the slowest encoder pipeline's summed stages, then the LLM's) plus ``K - 1`` times the
    slowest stage of all. With one encoder it is the paper's ``sum(stages) + (K - 1) * slowest``."""
    stages = [t for s in encoder_stage_ms for t in s] + list(llm_stage_ms)
    longest = max(encoder_stage_ms, key=sum)  # the first of equals
    return sum((*longest, *llm_stage_ms)) + (k - 1) * max(stages)  # config_search's additions at N = 1


@dataclass(frozen=True, slots=True)
class MultiEncoderConfig:
    """One evaluated configuration with N encoders: each encoder's and the LLM's ``ComponentConfig``
    (per-component stage times and memory from ``config_search.evaluate_config``)."""

    dp: int
    microbatch_size: int
    num_microbatches: int
    gpus_per_replica: int
    allocation: tuple[int, ...]
    """GPU budgets: each encoder's, then the LLM's (``allocate_gpus`` unless given)."""
    encoders: tuple[ComponentConfig, ...]
    llm: ComponentConfig
    predicted_iteration_time_ms: float
    """``eq2_ms`` of the stage times."""
    memory_ok: bool
    microbatch_count: str = "paper"
    """Encoder microbatches per replica (``assignment.stratified.MICROBATCH_COUNTS``): ``"paper"``:
    ``K_eff`` on the bottleneck encoder; ``"requested"``: the requested count. Not searched: Entrain's
    simulated check tries it (``sim.encoders_run.fit_entrain``); the plans of this configuration
    (``encoders_plan.generate_encoders_plan``, train's step planner) use it."""

    @property
    def gpus_used_per_replica(self) -> int:
        return sum(c.gpus for c in self.encoders) + self.llm.gpus

    def sort_key(self) -> tuple:
        return (
            not self.memory_ok,
            self.predicted_iteration_time_ms,
            self.gpus_used_per_replica * self.dp,
            self.dp,
            *((c.tp, c.cp, c.pp) for c in self.encoders),
            (self.llm.tp, self.llm.cp, self.llm.pp),
        )


def _options(
    cost: CostModel, comp: str, budget: int, tp: int | None, cp: int | None
) -> list[tuple[int, int, int]]:
    """Every (TP, CP, PP) of ``comp`` with PP the floor and the ceiling of ``budget / (TP * CP)``, at
    least 1, at most the component's layers (Algorithm 2's per-component candidates)."""
    n_layers = cost.component(comp).num_layers
    out = []
    for t in [tp] if tp is not None else [1, 2, 4, 8]:
        for c in [cp] if cp is not None else [1, 2]:
            if not has_costs(cost, comp, t, c):
                continue
            for pp in sorted({min(budget // (t * c), n_layers), min(-(-budget // (t * c)), n_layers)}):
                if pp >= 1 and (t, c, pp) not in out:
                    out.append((t, c, pp))
    return out


def search_encoders(
    samples: Sequence,
    encoders: Sequence[Encoder],
    parallel: ParallelConfig,
    *,
    allocation: Sequence[int] | None = None,
) -> list[MultiEncoderConfig]:
    """Every configuration Algorithm 2 visits for N encoders on ``parallel.gpus`` GPUs (``parallel.dp``
    None: every DP degree), best first (memory-feasible first, then the least ``eq2_ms``, fewer GPUs,
    the smallest degrees; with ``parallel.dp`` None, a degree leaving a replica fewer GPUs than
    components is skipped). Per component every (TP, CP, PP) within its budget (``allocation``, else
    ``allocate_gpus`` of the samples' work); a combination is kept when its GPUs fit the replica. Each
    encoder's stages are evaluated by ``evaluate_config`` on its own cost model and units, with the
    LLM's stage count after it (its in-flight depth); the LLM's with the first encoder that trains
    (the LLM then computes input gradients)."""
    _check_encoders(encoders)
    metas = _metas(samples)
    if not metas:
        raise ConfigError("the profile has no samples")
    stats = [encoder_stats(metas, e) for e in encoders]
    totals = component_totals(encoder_works(metas, encoders))
    gpus, tp, cp = gpus_of(parallel), parallel.tp, parallel.cp
    if allocation is not None and len(allocation) != len(encoders) + 1:
        raise ConfigError(f"allocation {list(allocation)}: need one budget per encoder and one for the LLM")
    trains = [any(x.trainable for x in e.cost.encoder.layers) for e in encoders]
    llm_from = trains.index(True) if any(trains) else 0
    out = []
    for d in dp_options(gpus, parallel.dp, parallel.global_batch, parallel.microbatch_size):
        g, at_d = gpus // d, replace(parallel, dp=d)
        if g < len(encoders) + 1 and parallel.dp is None:  # too few GPUs per replica for a GPU each
            continue
        alloc = tuple(allocation) if allocation is not None else allocate_gpus(g, totals)
        enc_opts = [_options(e.cost, "encoder", b, tp, cp) for e, b in zip(encoders, alloc)]
        for m in _options(encoders[0].cost, "llm", alloc[-1], tp, cp):
            per_enc: list[list[ComponentConfig]] = []
            llm_cfg = None
            for i, (e, opts) in enumerate(zip(encoders, enc_opts)):
                cfgs = []
                for o in opts:
                    cfg = evaluate_config(stats[i], e.cost, at_d, encoder=o, llm=m, gpus_per_replica=g)
                    cfgs.append(dataclasses.replace(cfg.encoder, name=e.name))
                    if i == llm_from and llm_cfg is None:
                        llm_cfg = cfg.llm
                per_enc.append(cfgs)
            if llm_cfg is None:  # the encoder the LLM is priced with has no option here
                continue
            for combo in itertools.product(*per_enc):
                if sum(c.gpus for c in combo) + llm_cfg.gpus > g:
                    continue
                limit = encoders[0].cost.hardware.device_memory_bytes
                mem_ok = all(x <= limit for c in (*combo, llm_cfg) for x in c.stage_memory_bytes)
                t = eq2_ms([c.stage_ms for c in combo], llm_cfg.stage_ms, at_d.num_microbatches)
                out.append(
                    MultiEncoderConfig(
                        d,
                        at_d.microbatch_size,
                        at_d.num_microbatches,
                        g,
                        alloc,
                        tuple(combo),
                        llm_cfg,
                        t,
                        mem_ok,
                    )
                )
    out.sort(key=MultiEncoderConfig.sort_key)
    return out


# --- Algorithm 1, N encoders ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EncodersTrial:
    """One batch size of Algorithm 1 with N encoders: the reference draw's allocation vector, every
    vector the reference and the ``k`` validation draws gave, and whether they all agree."""

    batch_size: int
    reference: tuple[int, ...]
    allocations_seen: tuple[tuple[int, ...], ...]

    @property
    def stable(self) -> bool:
        return len(self.allocations_seen) == 1


@dataclass(frozen=True, slots=True)
class EncodersBMin:
    b_min: int
    """The smallest stable size on the doubling path (the largest size tried when not converged)."""
    converged: bool
    allocation: tuple[int, ...]
    """The reference allocation at ``b_min``: each encoder's GPUs, then the LLM's."""
    k_trials: int
    trials: tuple[EncodersTrial, ...]


def find_b_min_encoders(
    sampler: Sampler,
    encoders: Sequence[Encoder],
    gpus_per_replica: int,
    config: BMinConfig = PAPER_BMIN_CONFIG,
) -> EncodersBMin:
    """Algorithm 1 with N encoders and the paper's test: ``n`` from ``config.n0``, multiplied by
    ``config.growth`` up to ``config.max_batch_size``, until the reference draw and ``k`` validation
    draws (seeded as ``bmin``'s: ``draw_seed(seed, n, t)``) give the same ``allocate_gpus`` vector."""
    _check_encoders(encoders)
    if config.n0 < 1 or config.growth < 2 or config.n0 > config.max_batch_size:
        raise ConfigError(
            f"n0 {config.n0}, growth {config.growth}, largest size {config.max_batch_size}: need "
            "1 <= n0 <= largest size and growth >= 2"
        )
    k = num_validation_trials(config.alpha, config.p_error)
    trials, n = [], config.n0
    while True:
        allocs = []
        for t in range(k + 1):
            items = sampler(n, draw_seed(config.seed, n, t))
            if len(items) != n:
                raise ConfigError(f"sampler returned {len(items)} samples, expected {n}")
            allocs.append(allocate_gpus(gpus_per_replica, component_totals(encoder_works(items, encoders))))
        seen = tuple(sorted(set(allocs)))
        trials.append(EncodersTrial(n, allocs[0], seen))
        if trials[-1].stable or n >= config.max_batch_size:
            break
        n = min(n * config.growth, config.max_batch_size)
    last = trials[-1]
    return EncodersBMin(last.batch_size, last.stable, last.reference, k, tuple(trials))
