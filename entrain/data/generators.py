"""Calibrated, seeded workload generators for the built-in datasets (pure numpy).

Each generator draws a sample's image size ``(H, W)`` in pixels and its text token count (chat
template included: ``11 + 2*n_images + sum_turns(10 + q + a)``, docs/workloads.md).

The generators live beside this module: the paper's datasets in ``entrain.data.paper_generators``
(their calibration), the workload zoo in ``entrain.data.zoo_generators``, the draws they share in
``entrain.data.generator_draws``; this module names them, holds ``curriculum`` (phases of the
others), draws blocks and slices samples.

Determinism and slicing: sample ``index`` of ``(name, seed)`` is a pure function of
``(name, seed, index)``. Indices are grouped in blocks of ``BLOCK_SIZE``; block ``k`` is drawn,
vectorised, from ``np.random.SeedSequence([seed, dataset_key, k])``, so any ``[start, start+n)``
slice equals the same slice of a longer draw. Regime runs restart at block boundaries.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from entrain.core.errors import ConfigError
from entrain.core.workload.aliases import DATASET_ALIASES, canonical_dataset
from entrain.core.workload.samples import DEFAULT_VISION, SampleMeta, VisionTokenConfig
from entrain.data.generator_draws import Gen, Rows, choice, join_samples, split_samples
from entrain.data.paper_generators import PAPER_GENERATORS
from entrain.data.zoo_generators import WITH_AUDIO, ZOO_GENERATORS

__all__ = [
    "DATASETS",
    "ALIASES",
    "BLOCK_SIZE",
    "SampleArrays",
    "canonical_name",
    "is_builtin",
    "generate_arrays",
    "generate_samples",
    "random_samples",
    "CURRICULUM_PHASES",
    "batch_source",
]

DATASETS: tuple[str, ...] = (
    "synthchartnet", "chartqa", "cocoqa", "llava150k", "synthchartnet-fv", "skewed",
    "docvqa", "multi-image", "video", "text-heavy", "long-context", "mixture", "curriculum", "anyres",
    "omni",
)  # fmt: skip
ALIASES = DATASET_ALIASES
"""Other names of the built-in datasets (``entrain.core.workload.aliases``, the one copy)."""
BLOCK_SIZE = 256
"""Samples per independently seeded block (also the longest possible SynthChartNet regime run)."""


@dataclass(frozen=True, slots=True)
class SampleArrays:
    """Column form of a draw: ``image_counts[i]`` images for sample ``i``, whose ``(H, W)`` in pixels
    are the next ``image_counts[i]`` entries of ``heights``/``widths`` (flattened, in sample order),
    and ``text_tokens[i]`` text tokens. The paper's four datasets have exactly one image a sample."""

    name: str
    seed: int
    start: int
    heights: np.ndarray
    widths: np.ndarray
    text_tokens: np.ndarray
    image_counts: np.ndarray
    audio: tuple[tuple[int, ...], ...] = ()
    """Per sample, the mel frames of its audio clips (``SampleMeta.audio``); () for a dataset without
    audio."""

    def __len__(self) -> int:
        return int(self.text_tokens.shape[0])

    def ids(self) -> list[str]:
        return [f"{self.name}-{self.seed}-{i}" for i in range(self.start, self.start + len(self))]

    def images(self) -> list[tuple[tuple[int, int], ...]]:
        """Per sample, its images' ``(H, W)``."""
        sizes = list(zip(self.heights.tolist(), self.widths.tolist()))
        ends = np.cumsum(self.image_counts).tolist()
        return [tuple(sizes[e - c : e]) for c, e in zip(self.image_counts.tolist(), ends)]

    def to_samples(self, vision: VisionTokenConfig = DEFAULT_VISION) -> list[SampleMeta]:
        audio = self.audio or ((),) * len(self)
        rows = zip(self.ids(), self.images(), self.text_tokens.tolist(), audio)
        return [SampleMeta(i, imgs, t, vision, audio=a) for i, imgs, t, a in rows]


CURRICULUM_PHASES: tuple[str, ...] = ("chartqa", "docvqa", "video")
"""``curriculum``'s phases in training order (docs/workloads.md), each a third of the run."""


def _curriculum(rng: np.random.Generator, n: int) -> Rows:
    """The whole mix (each sample from one phase's generator, equal weights, i.i.d.): what a draw of
    samples sees (the planner's pool, ``data stats``); per-iteration batches follow the phases
    (``batch_source``)."""
    source = choice(rng, [1.0] * len(CURRICULUM_PHASES), n)
    parts = [_GENERATORS[name](rng, n) for name in CURRICULUM_PHASES]
    per_sample = [split_samples(rows) for rows in parts]
    return join_samples([per_sample[s][i] for i, s in enumerate(source.tolist())])


_GENERATORS: dict[str, Gen] = {
    **PAPER_GENERATORS,
    **ZOO_GENERATORS,
    "curriculum": _curriculum,
}


# --- public API -----------------------------------------------------------------------------------


def canonical_name(name: str) -> str:
    """The built-in dataset ``name`` refers to (aliases resolved); ConfigError if none."""
    canonical = canonical_dataset(name)
    if canonical not in _GENERATORS:
        valid = ", ".join([*DATASETS, *ALIASES])
        raise ConfigError(f"unknown dataset {name!r}; built-in datasets: {valid}")
    return canonical


def is_builtin(name: str) -> bool:
    return canonical_dataset(name) in _GENERATORS


def batch_source(name: str, iteration: int, iterations: int) -> str:
    """The built-in dataset iteration ``iteration`` of ``iterations`` draws its global batch from:
    ``name`` itself, except for ``curriculum``, whose iterations fall in ``len(CURRICULUM_PHASES)``
    equal phases (iteration ``i`` in phase ``i * 3 // iterations``)."""
    name = canonical_name(name)
    if name != "curriculum":
        return name
    phase = min(len(CURRICULUM_PHASES) - 1, iteration * len(CURRICULUM_PHASES) // max(1, iterations))
    return CURRICULUM_PHASES[phase]


def _block(name: str, seed: int, block: int) -> Rows:
    return _block_with_audio(name, seed, block)[0]


def _block_with_audio(name: str, seed: int, block: int) -> tuple[Rows, list[tuple[int, ...]]]:
    """A block's rows and each sample's audio clips (none for a dataset without audio)."""
    key = zlib.crc32(name.encode())
    rng = np.random.default_rng(np.random.SeedSequence([seed, key, block]))
    if name in WITH_AUDIO:
        return WITH_AUDIO[name](rng, BLOCK_SIZE)
    return _GENERATORS[name](rng, BLOCK_SIZE), []


def _slice(rows: Rows, lo: int, hi: int) -> Rows:
    """Samples ``[lo, hi)`` of a block (or of concatenated blocks)."""
    counts, heights, widths, text = rows
    first, last = int(counts[:lo].sum()), int(counts[:hi].sum())
    return counts[lo:hi], heights[first:last], widths[first:last], text[lo:hi]


def _check_args(num_samples: int, seed: int, start: int) -> None:
    if num_samples < 0 or start < 0:
        raise ConfigError(f"num_samples and start must be >= 0, got {num_samples} and {start}")
    if seed < 0:
        raise ConfigError(f"seed must be >= 0 for the built-in generators, got {seed}")


def generate_arrays(name: str, num_samples: int, seed: int, start: int = 0) -> SampleArrays:
    """Samples ``[start, start + num_samples)`` of dataset ``name`` with ``seed``, as columns."""
    name = canonical_name(name)
    _check_args(num_samples, seed, start)
    if num_samples == 0:
        empty = np.zeros(0, dtype=np.int64)
        return SampleArrays(name, seed, start, empty, empty, empty, empty)
    first, last = start // BLOCK_SIZE, (start + num_samples - 1) // BLOCK_SIZE
    drawn = [_block_with_audio(name, seed, b) for b in range(first, last + 1)]
    offset = start - first * BLOCK_SIZE
    whole = tuple(np.concatenate(col) for col in zip(*(rows for rows, _ in drawn)))
    counts, heights, widths, text = _slice(whole, offset, offset + num_samples)
    audio = tuple(a for _, clips in drawn for a in clips)[offset : offset + num_samples]
    return SampleArrays(name, seed, start, heights, widths, text, counts, audio)


def generate_samples(
    name: str, num_samples: int, seed: int, start: int = 0, vision: VisionTokenConfig = DEFAULT_VISION
) -> list[SampleMeta]:
    """Samples ``[start, start + num_samples)``; ids ``f"{name}-{seed}-{index}"`` (canonical name).

    Sample ``index`` is the same whatever ``start``/``num_samples`` select it.
    """
    return generate_arrays(name, num_samples, seed, start).to_samples(vision)


def random_samples(
    name: str,
    num_samples: int,
    seed: int,
    *,
    population: int = 1 << 20,
    vision: VisionTokenConfig = DEFAULT_VISION,
) -> list[SampleMeta]:
    """``num_samples`` distinct indices drawn uniformly from ``[0, population)`` (sorted), i.e. an
    i.i.d.-like draw that ignores data-order correlation (contiguous slices keep SynthChartNet's
    regime runs). Algorithm 1 does not use it: its one sampler is ``entrain.data.sampling``."""
    _check_args(num_samples, seed, 0)
    if num_samples > population:
        raise ConfigError(f"cannot draw {num_samples} distinct samples from a population of {population}")
    pick = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED])).choice(
        population, num_samples, replace=False
    )
    name = canonical_name(name)
    blocks: dict[int, tuple[Rows, list[tuple[int, ...]]]] = {}
    out: list[SampleMeta] = []
    for idx in sorted(pick.tolist()):
        if idx // BLOCK_SIZE not in blocks:
            blocks[idx // BLOCK_SIZE] = _block_with_audio(name, seed, idx // BLOCK_SIZE)
        j = idx % BLOCK_SIZE
        rows, clips = blocks[idx // BLOCK_SIZE]
        counts, heights, widths, text = _slice(rows, j, j + 1)
        images = tuple(zip(heights.tolist(), widths.tolist()))
        audio = clips[j] if clips else ()
        out.append(SampleMeta(f"{name}-{seed}-{idx}", images, int(text[0]), vision, audio=audio))
    return out
