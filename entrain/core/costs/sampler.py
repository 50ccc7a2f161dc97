"""What the planner knows of a dataset: seeded draws of a sampler and their column statistics.

A *sampler* is ``sampler(n, seed) -> Sequence[SampleMeta | SampleWork]``: ``n`` samples drawn i.i.d.
(with replacement) from the dataset with that seed: ``pool_sampler`` over a fixed list, which
``entrain.data.sampling.dataset_sampler`` builds for every command. Items without token metadata
(raw-work samples) are supported for Algorithm 1; Algorithm 2 then spreads a component's work over its
layers by their linear costs (``mean_layer_ms``).

* Workload of a sample = forward + backward ms of each whole component at TP = CP = 1, per-call
  constants excluded (``CostModel.sample_work``). A batch's encoder share ``P`` = total encoder work /
  total work.
* ProportionalAllocation: the encoder gets ``round(G * P)`` of a replica's ``G`` GPUs, rounded to the
  nearest whole GPU with ties to the LLM, clamped so each component keeps at least one GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from entrain.core.costs.costmodel import CostModel, EncoderUnits, parallel_key
from entrain.core.errors import ConfigError
from entrain.core.workload.sample_table import SampleTable, TableDraw
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork

__all__ = [
    "Item",
    "Sampler",
    "SampleStats",
    "MacroscopicProfiler",
    "layer_coefficients",
    "audio_coefficients",
    "has_costs",
    "mean_layer_ms",
    "proportional_allocation",
    "draw_seed",
    "pool_sampler",
    "encoder_share",
]

Item = SampleMeta | SampleWork
Sampler = Callable[[int, int], Sequence[Item]]


@dataclass(frozen=True, slots=True)
class SampleStats:
    """Column statistics of a batch: per sample, encoder units' sum and sum of squares (every encoder
    row: ViT patches over its images and video frames, and its audio rows), LLM tokens and their
    square; ``raw_*`` = given work for items without metadata (NaN otherwise); ``aud_*`` = the audio
    tower's rows among the encoder columns (``SampleMeta.audio_units``; None: no sample has audio).

    Summaries by column (``column_summary``): ``encoder`` (every row: what memory and the small-call
    factor see, as the simulator's sums), ``vision`` (the encoder rows less the audio rows), ``audio``
    and ``llm``. Where the cost model's encoder runs an audio tower (``CostModel.audio_tower``) its
    time is priced per tower (``tower_split``): the vision columns by the encoder's layers, the audio
    columns by the tower's (``audio_coefficients``), as ``CostModel.units`` prices a sample."""

    ids: Sequence[str]
    enc_x1: np.ndarray
    enc_x2: np.ndarray
    llm_x1: np.ndarray
    llm_x2: np.ndarray
    raw_encoder: np.ndarray
    raw_llm: np.ndarray
    aud_x1: np.ndarray | None = None
    aud_x2: np.ndarray | None = None
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
        heard = np.zeros((2, n))
        ids = []
        for j, item in enumerate(items):
            meta = item if isinstance(item, SampleMeta) else item.meta
            ids.append(item.id)
            if meta is not None:
                patches = meta.encoder_units
                x = meta.llm_tokens
                cols[0, j] = sum(patches)
                cols[1, j] = sum(p * p for p in patches)
                cols[2, j] = x
                cols[3, j] = x * x
                if meta.audio:
                    audio = meta.audio_units
                    heard[0, j] = sum(audio)
                    heard[1, j] = sum(u * u for u in audio)
            else:
                cols[4, j] = item.encoder
                cols[5, j] = item.llm
        if heard.any():
            return cls(tuple(ids), *cols, heard[0], heard[1])
        return cls(tuple(ids), *cols)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def has_tokens(self) -> bool:
        got = self._memo.get("has_tokens")
        if got is None:
            got = self._memo["has_tokens"] = not np.isnan(self.enc_x1).any()
        return got

    def columns(self, comp: str) -> tuple[np.ndarray, np.ndarray]:
        """``comp``'s per-sample (x, x^2) columns: ``encoder`` (every encoder row), ``vision`` (the
        encoder rows less the audio rows), ``audio`` (the audio tower's rows) or ``llm``."""
        if comp == "llm":
            return self.llm_x1, self.llm_x2
        if comp == "encoder" or (comp == "vision" and self.aud_x1 is None):
            return self.enc_x1, self.enc_x2
        if comp == "vision":
            return self.enc_x1 - self.aud_x1, self.enc_x2 - self.aud_x2
        if comp == "audio":
            if self.aud_x1 is None:
                zero = np.zeros(len(self.ids))
                return zero, zero.copy()
            return self.aud_x1, self.aud_x2
        raise ValueError(f"unknown column {comp!r}; expected encoder, vision, audio or llm")

    def column_summary(self, comp: str) -> tuple[float, float, float, float]:
        """``comp``'s (mean x, mean x^2, x and x^2 of the sample with the largest x; the first of equals);
        ``comp`` as ``columns``."""
        got = self._memo.get(comp)
        if got is None:
            x1, x2 = self.columns(comp)
            j = int(np.argmax(x1))
            got = self._memo[comp] = (float(x1.mean()), float(x2.mean()), float(x1[j]), float(x2[j]))
        return got

    def tower_split(self, cost: CostModel, comp: str) -> bool:
        """Whether ``comp``'s time on ``cost`` is priced per tower: the encoder of a cost model whose
        encoder runs an audio tower (``CostModel.audio_tower``), over a batch with audio rows."""
        return comp == "encoder" and self.aud_x1 is not None and cost.audio_tower

    def work(self, cost: CostModel, tp: int = 1, cp: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Per-sample (encoder, llm) forward+backward ms without per-call constants (an audio tower's rows
        by its own layers: ``tower_split``)."""
        out = []
        for comp, raw in (("encoder", self.raw_encoder), ("llm", self.raw_llm)):
            coeffs = layer_coefficients(cost, comp, tp, cp).sum(axis=0)
            if self.tower_split(cost, comp):
                x1, x2 = self.columns("vision")
                heard = audio_coefficients(cost, tp, cp).sum(axis=0)
                w = coeffs[0] * x2 + coeffs[1] * x1 + (heard[0] * self.aud_x2 + heard[1] * self.aud_x1)
            else:
                x1, x2 = self.columns(comp)
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


def audio_coefficients(cost: CostModel, tp: int = 1, cp: int = 1) -> np.ndarray:
    """``[num_layers, 2]`` array of each encoder layer's forward + backward audio-tower ``(a, b)`` per
    audio row at ``(tp, cp)`` (``LayerCost.audio``, 0 on a layer without one; no per-call constant, as
    ``CostModel.layer_ms`` prices the tower), what ``layer_coefficients`` is for the vision rows."""
    key = (id(cost), "audio", tp, cp)
    hit = _COEFF_CACHE.get(key)
    if hit is not None and hit[0] is cost:
        return hit[1]
    rows = []
    for i in range(cost.encoder.num_layers):

        def t(x, i=i):
            units = EncoderUnits.of((x,), 1)  # one audio unit of x rows, no vision rows
            return sum(cost.layer_ms("encoder", i, units, p, tp, cp, num_calls=0) for p in ("fwd", "bwd"))

        v1, v2 = t(1), t(2)
        a = (v2 - 2.0 * v1) / 2.0
        rows.append((a, v1 - a))
    arr = np.asarray(rows, dtype=float).reshape(-1, 2)
    _COEFF_CACHE[key] = (cost, arr)
    return arr


def has_costs(cost: CostModel, component: str, tp: int, cp: int) -> bool:
    key = parallel_key(tp, cp)
    return all(key in layer.fwd for layer in cost.component(component).layers)


def mean_layer_ms(stats: SampleStats, cost: CostModel, comp: str, tp: int, cp: int, u: int) -> np.ndarray:
    """Per-layer forward + backward ms of a microbatch of ``u`` mean samples (constants included)."""
    coeffs = layer_coefficients(cost, comp, tp, cp)
    if stats.has_tokens and stats.tower_split(cost, comp):  # vision rows by its layers, audio by its tower
        vis_x1, vis_x2 = stats.column_summary("vision")[:2]
        aud_x1, aud_x2 = stats.column_summary("audio")[:2]
        heard = audio_coefficients(cost, tp, cp)
        var = coeffs[:, 0] * vis_x2 + coeffs[:, 1] * vis_x1 + (heard[:, 0] * aud_x2 + heard[:, 1] * aud_x1)
        mean_x1 = stats.column_summary(comp)[0]  # every row: the call's size (the small-call factor)
    elif stats.has_tokens:
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
