"""Calibrated, seeded workload generators for the built-in datasets (pure numpy).

Each generator draws a sample's image size ``(H, W)`` in pixels and its text token count (chat
template included: ``11 + 2*n_images + sum_turns(10 + q + a)``, docs/workloads.md).

Calibration (bounds and sources in ``entrain/data/calibration/bounds.json``, checked by
``tests/data/test_generators.py``):

- text: per-sample turns, question and answer tokens reproduce FineVision's per-subset totals
  (their published table); the shapes (lognormals, turn-count laws) are our fits to it.
- images: ViT-patch CDFs of the paper's Fig. 3 (COCO-QA / LLaVA ~1-2K patches, ChartQA mostly ~2K
  with a tail past 4K, SynthChartNet broadest ~400-8K) and, for SynthChartNet, the per-microbatch
  vision-work variability of Table 3 / Fig. 15 (std/mean ~0.7 under DistTrain-like batching). The
  latter cannot come from independent samples (16-sample sums average it away), so SynthChartNet's
  data order is a regime process: runs of charts from one *family* (compact thumbnails, default
  120-DPI figures, high-resolution canvases), each run's family drawn from fixed weights. ChartQA's
  sources (Statista / Pew / OWID-like) also arrive in runs, which gives Table 3's SynthChartNet :
  ChartQA DistTrain vision-std ratio (~3.5 after removing the noise floor); COCO-QA and LLaVA are
  i.i.d. Profiling batches must not be contiguous slices: Algorithm 1 draws uniformly with
  replacement from a pool of samples (``entrain.data.sampling.dataset_sampler``).

Determinism and slicing: sample ``index`` of ``(name, seed)`` is a pure function of
``(name, seed, index)``. Indices are grouped in blocks of ``BLOCK_SIZE``; block ``k`` is drawn,
vectorised, from ``np.random.SeedSequence([seed, dataset_key, k])``, so any ``[start, start+n)``
slice equals the same slice of a longer draw. Regime runs restart at block boundaries.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from entrain.core.errors import ConfigError
from entrain.core.workload.aliases import DATASET_ALIASES, canonical_dataset
from entrain.core.workload.samples import DEFAULT_VISION, SampleMeta, VisionTokenConfig

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

SYSTEM_TOKENS = 11
"""Qwen2 chat template's default system block."""
TURN_TOKENS = 10
"""Template tokens of one user + assistant turn."""
VISION_MARKER_TOKENS = 2
"""``<|vision_start|>`` + ``<|vision_end|>`` per image."""


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


# --- random helpers -------------------------------------------------------------------------------


def _ln(rng: np.random.Generator, mean: float, sigma: float, size) -> np.ndarray:
    """Lognormal with the given *mean* (not median) and log-sd ``sigma``."""
    return rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, size)


def _tok(x: np.ndarray, lo: int = 1) -> np.ndarray:
    """Round half to even (like Python's ``round``) and floor at ``lo``."""
    return np.maximum(lo, np.rint(x)).astype(np.int64)


def _choice(rng: np.random.Generator, probs: list[float], size: int) -> np.ndarray:
    p = np.asarray(probs, dtype=float)
    return rng.choice(len(p), size=size, p=p / p.sum())


def _turn_sums(k: np.ndarray, q: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Template + question + answer tokens of the first ``k[i]`` turns of row ``i``."""
    used = np.arange(q.shape[1])[None, :] < k[:, None]
    return ((TURN_TOKENS + q + a) * used).sum(axis=1)


def _text_total(turn_tokens: np.ndarray) -> np.ndarray:
    return (SYSTEM_TOKENS + VISION_MARKER_TOKENS + turn_tokens).astype(np.int64)


# --- text generators (FineVision-calibrated) ------------------------------------------------------


def _llava_text(rng: np.random.Generator, n: int) -> np.ndarray:
    subset = _choice(rng, [0.362, 0.148, 0.490], n)  # conversation / detail / complex reasoning
    k_conv = 1 + _choice(rng, [0.02, 0.12, 0.20, 0.20, 0.18, 0.13, 0.08, 0.04, 0.02, 0.01], n)
    conv = _turn_sums(k_conv, _tok(_ln(rng, 12, 0.35, (n, 10))), _tok(_ln(rng, 58, 0.6, (n, 10)), 2))
    detail = TURN_TOKENS + _tok(_ln(rng, 10, 0.2, n)) + _tok(_ln(rng, 122, 0.3, n), 20)
    complex_ = TURN_TOKENS + _tok(_ln(rng, 16.5, 0.35, n)) + _tok(_ln(rng, 147, 0.35, n), 20)
    return _text_total(np.choose(subset, [conv, detail, complex_]))


def _chartqa_text(rng: np.random.Generator, n: int) -> np.ndarray:
    k = 1 + _choice(rng, [0.50, 0.45, 0.05], n)
    return _text_total(_turn_sums(k, _tok(_ln(rng, 22.1, 0.3, (n, 3))), _tok(_ln(rng, 4.8, 0.6, (n, 3)))))


def _cocoqa_text(rng: np.random.Generator, n: int) -> np.ndarray:
    k = 1 + _choice(rng, [0.48, 0.37, 0.12, 0.03], n)
    answers = np.minimum(8, 1 + rng.poisson(1.7, (n, 4)))
    return _text_total(_turn_sums(k, _tok(_ln(rng, 14.4, 0.25, (n, 4))), answers))


def _synthchart_text(rng: np.random.Generator, n: int) -> np.ndarray:
    question = np.where(rng.random(n) < 0.66, 4, 5)
    answer = np.clip(_ln(rng, 135, 0.45, n), 30, 1200).astype(np.int64)
    return _text_total(TURN_TOKENS + question + answer)


# --- image generators: return (heights, widths) ---------------------------------------------------

_COCO_SIZES = [  # (W, H), weight: the common Flickr-640 sizes of COCO
    ((640, 480), 0.35), ((640, 427), 0.27), ((480, 640), 0.08), ((427, 640), 0.08), ((640, 426), 0.03),
    ((640, 428), 0.03), ((500, 375), 0.03), ((640, 640), 0.025), ((612, 612), 0.015),
]  # fmt: skip


def _coco_images(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    u = rng.random(n)
    cat = _choice(rng, [p for _, p in _COCO_SIZES], n)
    w = np.array([s[0] for s, _ in _COCO_SIZES])[cat]
    h = np.array([s[1] for s, _ in _COCO_SIZES])[cat]
    # small tail: long side U(320, 500), short/long U(0.6, 1), 75% landscape
    long_side = rng.uniform(320, 500, n).astype(np.int64)
    short_side = (long_side * rng.uniform(0.6, 1.0, n)).astype(np.int64)
    landscape = rng.random(n) < 0.75
    small = u < 0.055
    w = np.where(small, np.where(landscape, long_side, short_side), w)
    h = np.where(small, np.where(landscape, short_side, long_side), h)
    wide = (u >= 0.055) & (u < 0.085)  # panoramic tail, 640 x U(300, 420)
    square = (u >= 0.085) & (u < 0.10)  # near-square large tail, 640 x U(560, 639)
    w = np.where(wide | square, 640, w)
    h = np.where(wide, rng.uniform(300, 420, n).astype(np.int64), h)
    h = np.where(square, rng.uniform(560, 639, n).astype(np.int64), h)
    return h, w


_CHARTQA_MEAN_RUN_SAMPLES = 16
"""Mean run of one chart source in ChartQA's data order (tuned to Table 3's DistTrain vision std)."""


def _chartqa_images(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    # Statista-like / Pew-like / OWID-OECD-like charts, arriving in runs by source (data order)
    source = _regimes(rng, n, [0.60, 0.30, 0.10], _CHARTQA_MEAN_RUN_SAMPLES)
    statista_h = np.clip(rng.normal(560, 50, n), 380, 900).astype(np.int64)
    pew_w = np.array([310, 420, 640, 800])[_choice(rng, [0.35, 0.30, 0.20, 0.15], n)]
    pew_h = (pew_w * np.clip(_ln(rng, 1.15, 0.35, n), 0.5, 2.6)).astype(np.int64)
    owid_h = np.clip(rng.normal(600, 40, n), 450, 750).astype(np.int64)
    w = np.choose(source, [np.full(n, 800), pew_w, np.full(n, 850)])
    h = np.choose(source, [statista_h, pew_h, owid_h])
    return h, w


def _synthchart_fv_images(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """FineVision-size SynthChartNet: 120-DPI Matplotlib/Seaborn figures or Pyecharts' 900x500."""
    fig = _choice(rng, [0.7, 0.2, 0.1], n)  # 6.4x4.8 / 8x6 / 10x6 inches at 120 DPI
    mpl_w = np.array([768, 960, 1200])[fig]
    mpl_h = np.array([576, 720, 720])[fig]
    pyecharts = rng.random(n) >= 2 / 3
    return np.where(pyecharts, 500, mpl_h), np.where(pyecharts, 900, mpl_w)


# SynthChartNet chart families (regimes): 0 compact, 1 default, 2 high-resolution. [F], tuned to
# Table 3's std/mean, Fig. 15's min/max and Fig. 3's ~400-8K patch spread.
_FAMILY_WEIGHTS = [0.45, 0.35, 0.20]
_COMPACT_WIDTH_PX = (340, 560)
"""Small figures / thumbnails: ~450-1.2K ViT patches."""
_HIRES_WIDTH_PX = (1150, 1500)
"""Large canvases / high-DPI renders: ~4.5K-8.6K ViT patches."""
_ASPECTS = [0.75, 0.6667, 0.5625]
"""H/W of compact and high-resolution charts (4:3, 3:2, 16:9), drawn .5/.25/.25."""
_DEFAULT_SIZES = [((768, 576), 0.45), ((900, 500), 0.30), ((960, 720), 0.15), ((1000, 600), 0.10)]
"""(W, H) of 120-DPI Matplotlib/Seaborn figures and Pyecharts' canvas: ~2.3K-3.5K ViT patches."""
_MEAN_RUN_SAMPLES = 16
"""Mean length of a run of one family in data order (geometric)."""


def _regimes(rng: np.random.Generator, n: int, weights: list[float], mean_run: float) -> np.ndarray:
    """Regime index per position in data order: runs of geometric length (mean ``mean_run``), each
    run's regime drawn independently from ``weights``."""
    new_run = rng.random(n) < 1.0 / mean_run
    new_run[0] = True
    run_id = np.cumsum(new_run) - 1
    run_regime = _choice(rng, weights, n)  # one draw per possible run
    return run_regime[run_id]


def _synthchart_images(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    family = _regimes(rng, n, _FAMILY_WEIGHTS, _MEAN_RUN_SAMPLES)
    aspect = np.array(_ASPECTS)[_choice(rng, [0.5, 0.25, 0.25], n)]
    compact_w = rng.uniform(*_COMPACT_WIDTH_PX, n).astype(np.int64)
    hires_w = rng.uniform(*_HIRES_WIDTH_PX, n).astype(np.int64)
    cat = _choice(rng, [p for _, p in _DEFAULT_SIZES], n)
    default_w = np.array([s[0] for s, _ in _DEFAULT_SIZES])[cat]
    default_h = np.array([s[1] for s, _ in _DEFAULT_SIZES])[cat]
    width = np.choose(family, [compact_w, default_w, hires_w])
    height = np.where(family == 1, default_h, (width * aspect).astype(np.int64))
    return height, width


def _skewed_images(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    sides = np.exp(rng.uniform(math.log(112), math.log(896), (2, n)))
    sides = np.clip(np.rint(sides), 112, 896).astype(np.int64)
    return sides[0], sides[1]


def _skewed_text(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.clip(np.rint(np.exp(rng.uniform(math.log(16), math.log(256), n))), 16, 256).astype(np.int64)


# --- the workload zoo (names in docs/contract.md; distributions and sources in docs/workloads.md) -

Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""A block of samples: ``(image_counts, heights, widths, text_tokens)``, images flattened."""


def _one_image(text: np.ndarray, hw: tuple[np.ndarray, np.ndarray]) -> Rows:
    return np.ones(text.shape[0], dtype=np.int64), hw[0], hw[1], text


def _rows(counts: np.ndarray, heights: np.ndarray, widths: np.ndarray, text: np.ndarray) -> Rows:
    """Rows from per-sample ``counts`` and per-slot ``(n, max_count)`` sizes (first ``counts[i]`` used)."""
    used = np.arange(heights.shape[1])[None, :] < counts[:, None]
    return counts.astype(np.int64), heights[used].astype(np.int64), widths[used].astype(np.int64), text


def _qa_text(rng: np.random.Generator, n: int, turns: np.ndarray, q_mean: float, a_mean: float,
             a_sigma: float, a_max: int = 8192) -> np.ndarray:  # fmt: skip
    """Template + question + answer tokens of ``turns[i]`` turns (lognormal questions and answers)."""
    width = int(turns.max()) if n else 1
    q = _tok(_ln(rng, q_mean, 0.5, (n, width)))
    a = np.minimum(a_max, _tok(_ln(rng, a_mean, a_sigma, (n, width))))
    return _turn_sums(turns, q, a)


def _with_template(turn_tokens: np.ndarray, visual_items: np.ndarray) -> np.ndarray:
    """``11 + 2 * visual_items + turns`` (a video is one visual item: one start/end marker pair)."""
    return (SYSTEM_TOKENS + VISION_MARKER_TOKENS * visual_items + turn_tokens).astype(np.int64)


DOC_LONG_SIDE_PX = (800, 3500)
"""Scanned pages' long side (docs/workloads.md): fax/low-DPI, 200-DPI and 300-DPI letter/A4 scans."""
DOC_OCR_SHARE = 0.6
"""Share of document samples whose prompt carries the page's OCR text [assumed]."""


def _docvqa(rng: np.random.Generator, n: int) -> Rows:
    scan = _choice(rng, [0.30, 0.45, 0.25], n)  # ~100 DPI / 200 DPI / 300 DPI letter-size scans
    long_side = np.choose(
        scan, [rng.uniform(800, 1300, n), rng.normal(2200, 150, n), rng.uniform(2900, 3500, n)]
    )
    long_side = np.clip(long_side, *DOC_LONG_SIDE_PX)
    short_side = long_side * np.where(rng.random(n) < 0.7, 8.5 / 11, 1 / math.sqrt(2))  # letter / A4
    landscape = rng.random(n) < 0.1
    heights = np.where(landscape, short_side, long_side).astype(np.int64)
    widths = np.where(landscape, long_side, short_side).astype(np.int64)
    turns = np.minimum(12, 1 + rng.poisson(2.9, n))  # ~3.9 questions per page
    qa = _qa_text(rng, n, turns, q_mean=13, a_mean=5, a_sigma=0.7)
    ocr = np.where(rng.random(n) < DOC_OCR_SHARE, np.clip(_tok(_ln(rng, 700, 0.7, n)), 64, 4096), 0)
    return _one_image(_with_template(qa + ocr, np.ones(n, dtype=np.int64)), (heights, widths))


MULTI_IMAGE_COUNT_WEIGHTS = [0.22, 0.20, 0.14, 0.12, 0.10, 0.08, 0.07, 0.07]
"""P(1..8 images) of an interleaved / multi-image instruction sample [assumed; mean ~3.4]."""


def _web_photos(rng: np.random.Generator, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Web images: long side lognormal (mean 700 px) in [224, 1536], 4:3 / 3:2 / 16:9 / square."""
    long_side = np.clip(_ln(rng, 700, 0.4, shape), 224, 1536)
    aspect = np.array([0.75, 2 / 3, 0.5625, 1.0])[_choice(rng, [0.4, 0.25, 0.2, 0.15], shape[0] * shape[1])]
    short_side = long_side * aspect.reshape(shape)
    portrait = rng.random(shape) < 0.25
    heights = np.where(portrait, long_side, short_side).astype(np.int64)
    widths = np.where(portrait, short_side, long_side).astype(np.int64)
    return heights, widths


def _multi_image(rng: np.random.Generator, n: int) -> Rows:
    counts = 1 + _choice(rng, MULTI_IMAGE_COUNT_WEIGHTS, n)
    heights, widths = _web_photos(rng, (n, len(MULTI_IMAGE_COUNT_WEIGHTS)))
    turns = 1 + _choice(rng, [0.6, 0.3, 0.1], n)
    text = _with_template(_qa_text(rng, n, turns, q_mean=30, a_mean=90, a_sigma=0.7), counts)
    return _rows(counts, heights, widths, text)


VIDEO_FRAMES = (4, 32)
"""Frames a video sample (docs/workloads.md); even, as Qwen2.5-VL's temporal patch spans 2 frames."""
VIDEO_FRAME_MAX_PIXELS = 768 * 28 * 28
"""qwen_vl_utils' per-frame pixel cap for video (VIDEO_MAX_PIXELS)."""
_VIDEO_SOURCES = [((640, 360), 0.30), ((854, 480), 0.35), ((1280, 720), 0.30), ((1920, 1080), 0.05)]
"""(W, H) of the source clips: 360p / 480p / 720p / 1080p [assumed weights]."""


def _video(rng: np.random.Generator, n: int) -> Rows:
    """A video of T frames is T/2 temporal patches; each is priced as one image of the frame size
    (Qwen2.5-VL's ViT attends within each temporal patch, and the LLM sees T/2 x (H'/28)(W'/28) tokens)."""
    fixed = np.array([8, 16, 32])[_choice(rng, [0.45, 0.35, 0.20], n)]  # uniform-budget sampling
    fps2 = 2 * np.rint(_ln(rng, 8, 0.6, n)).astype(np.int64)  # 2 fps over a clip of ~8 s
    frames = np.clip(np.where(rng.random(n) < 0.6, fixed, fps2), *VIDEO_FRAMES)
    frames = frames - frames % 2
    src = _choice(rng, [p for _, p in _VIDEO_SOURCES], n)
    w = np.array([s[0] for s, _ in _VIDEO_SOURCES])[src].astype(float)
    h = np.array([s[1] for s, _ in _VIDEO_SOURCES])[src].astype(float)
    scale = np.minimum(1.0, np.sqrt(VIDEO_FRAME_MAX_PIXELS / (w * h)))
    portrait = rng.random(n) < 0.1
    fh, fw = np.where(portrait, w, h) * scale, np.where(portrait, h, w) * scale
    width = VIDEO_FRAMES[1] // 2
    counts = frames // 2
    heights = np.repeat(fh.astype(np.int64)[:, None], width, axis=1)
    widths = np.repeat(fw.astype(np.int64)[:, None], width, axis=1)
    turns = 1 + (rng.random(n) < 0.3)
    text = _with_template(
        _qa_text(rng, n, turns, q_mean=15, a_mean=25, a_sigma=0.8), np.ones(n, dtype=np.int64)
    )
    return _rows(counts, heights, widths, text)


TEXT_ONLY_SHARE = 0.5
"""Share of ``text-heavy`` samples without an image (docs/workloads.md: about half)."""


def _text_heavy(rng: np.random.Generator, n: int) -> Rows:
    text_only = rng.random(n) < TEXT_ONLY_SHARE
    turns = 1 + _choice(rng, [0.55, 0.3, 0.15], n)
    only = _qa_text(rng, n, turns, q_mean=60, a_mean=420, a_sigma=0.7, a_max=4096)
    with_image = _qa_text(rng, n, turns, q_mean=25, a_mean=250, a_sigma=0.6, a_max=4096)
    counts = (~text_only).astype(np.int64)
    text = _with_template(np.where(text_only, only, with_image), counts)
    heights, widths = _coco_images(rng, n)
    return _rows(counts, heights[:, None], widths[:, None], text)


LONG_CONTEXT_TOKENS = (2048, 16384)
"""Text tokens of a ``long-context`` sample (docs/workloads.md), log-uniform."""
LONG_CONTEXT_IMAGE_SHARE = 0.4
"""Share of long-context samples with their one small image [assumed]."""


def _long_context(rng: np.random.Generator, n: int) -> Rows:
    lo, hi = LONG_CONTEXT_TOKENS
    text = np.clip(np.rint(np.exp(rng.uniform(math.log(lo), math.log(hi), n))), lo, hi).astype(np.int64)
    counts = (rng.random(n) < LONG_CONTEXT_IMAGE_SHARE).astype(np.int64)
    long_side = rng.uniform(224, 448, n)
    short_side = long_side * np.array([1.0, 0.75, 0.5625])[_choice(rng, [0.4, 0.4, 0.2], n)]
    return _rows(counts, short_side[:, None], long_side[:, None], text)


MIXTURE_WEIGHTS = {
    "docvqa": 0.15,
    "multi-image": 0.20,
    "video": 0.15,
    "text-heavy": 0.30,
    "long-context": 0.20,
}
"""Per-sample source of ``mixture`` (i.i.d. in data order) [assumed]."""


def _mixture(rng: np.random.Generator, n: int) -> Rows:
    source = _choice(rng, list(MIXTURE_WEIGHTS.values()), n)
    parts = [_ZOO[name](rng, n) for name in MIXTURE_WEIGHTS]
    per_sample = [_split(rows) for rows in parts]
    picked = [per_sample[s][i] for i, s in enumerate(source.tolist())]
    return _join(picked)


def _split(rows: Rows) -> list[tuple[np.ndarray, np.ndarray, int]]:
    counts, heights, widths, text = rows
    ends = np.cumsum(counts)
    return [(heights[e - c : e], widths[e - c : e], int(t)) for c, e, t in zip(counts, ends, text)]


def _join(samples: list[tuple[np.ndarray, np.ndarray, int]]) -> Rows:
    empty = np.zeros(0, dtype=np.int64)
    counts = np.array([len(h) for h, _, _ in samples], dtype=np.int64)
    heights = np.concatenate([empty, *(h for h, _, _ in samples)]).astype(np.int64)
    widths = np.concatenate([empty, *(w for _, w, _ in samples)]).astype(np.int64)
    return counts, heights, widths, np.array([t for _, _, t in samples], dtype=np.int64)


CURRICULUM_PHASES: tuple[str, ...] = ("chartqa", "docvqa", "video")
"""``curriculum``'s phases in training order (docs/workloads.md), each a third of the run."""


def _curriculum(rng: np.random.Generator, n: int) -> Rows:
    """The whole mix (each sample from one phase's generator, equal weights, i.i.d.): what a draw of
    samples sees (the planner's pool, ``data stats``); per-iteration batches follow the phases
    (``batch_source``)."""
    source = _choice(rng, [1.0] * len(CURRICULUM_PHASES), n)
    parts = [_GENERATORS[name](rng, n) for name in CURRICULUM_PHASES]
    per_sample = [_split(rows) for rows in parts]
    return _join([per_sample[s][i] for i, s in enumerate(source.tolist())])


ANYRES_SOURCE_WEIGHTS = [0.35, 0.20, 0.25, 0.20]
"""Per-sample source of ``anyres``: web photos, charts, document pages, screenshots [assumed]."""
_SCREENSHOTS = [((1920, 1080), 0.35), ((2560, 1440), 0.15), ((1080, 2400), 0.30), ((800, 3000), 0.20)]
"""(W, H) of screenshots: desktop 1080p / 1440p, phone, long infographics [assumed weights]."""


def _screenshots(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    pick = _choice(rng, [p for _, p in _SCREENSHOTS], n)
    return (np.array([s[1] for s, _ in _SCREENSHOTS])[pick], np.array([s[0] for s, _ in _SCREENSHOTS])[pick])


def _anyres(rng: np.random.Generator, n: int) -> Rows:
    """One image a sample of very different sizes and aspect ratios (LLaVA-OneVision's single-image
    stage: photos, charts, pages, screenshots), so AnyRes tiles it into 2..37 tiles."""
    source = _choice(rng, ANYRES_SOURCE_WEIGHTS, n)
    photo_h, photo_w = _web_photos(rng, (n, 1))
    chart_h, chart_w = _synthchart_images(rng, n)
    _, page_h, page_w, _ = _docvqa(rng, n)
    shot_h, shot_w = _screenshots(rng, n)
    heights = np.choose(source, [photo_h[:, 0], chart_h, page_h, shot_h]).astype(np.int64)
    widths = np.choose(source, [photo_w[:, 0], chart_w, page_w, shot_w]).astype(np.int64)
    turns = 1 + np.minimum(7, rng.poisson(1.2, n))
    qa = _qa_text(rng, n, turns, q_mean=18, a_mean=60, a_sigma=0.9)
    text = _with_template(qa, np.ones(n, dtype=np.int64))
    return _one_image(text, (heights, widths))


OMNI_SOURCE_WEIGHTS = {"speech-qa": 0.40, "audio-caption": 0.30, "image-audio": 0.30}
"""Per-sample source of ``omni`` (i.i.d.) [assumed]: a spoken passage with questions about it, a sound
to caption, a photo with a spoken question about it."""
SPEECH_MEAN_SECONDS = 12.0
"""Mean speech-QA clip (docs/workloads.md: LibriSpeech's utterances average about 12 s)."""
AUDIOCAPS_SHARE = 0.7
"""Captioning clips of AudioCaps' fixed 10 s (AudioSet segments); the rest Clotho's 15-30 s [assumed share]."""
CLOTHO_SECONDS = (15.0, 30.0)
SPOKEN_QUESTION_MEAN_SECONDS = 4.0
"""Mean spoken question about an image [assumed]."""
MEL_FRAMES_PER_SECOND = 100
"""Whisper's 10-ms hop (160 samples at 16 kHz); a clip is cut at 30 s (3,000 frames) as the processor does."""


def _omni_with_audio(rng: np.random.Generator, n: int) -> tuple[Rows, list[tuple[int, ...]]]:
    """Rows of ``omni`` and each sample's one audio clip (mel frames); audio markers count as a
    visual item's (``<|audio_bos|>`` / ``<|audio_eos|>``)."""
    source = _choice(rng, list(OMNI_SOURCE_WEIGHTS.values()), n)
    speech = np.clip(_ln(rng, SPEECH_MEAN_SECONDS, 0.5, n), 1.0, 30.0)
    caption = np.where(rng.random(n) < AUDIOCAPS_SHARE, 10.0, rng.uniform(*CLOTHO_SECONDS, n))
    question = np.clip(_ln(rng, SPOKEN_QUESTION_MEAN_SECONDS, 0.5, n), 1.0, 15.0)
    seconds = np.choose(source, [speech, caption, question])
    frames = np.clip(np.rint(seconds * MEL_FRAMES_PER_SECOND), 1, 30 * MEL_FRAMES_PER_SECOND).astype(np.int64)
    counts = (source == 2).astype(np.int64)
    heights, widths = _web_photos(rng, (n, 1))
    turns = 1 + (rng.random(n) < 0.3)
    speech_qa = _qa_text(rng, n, turns, q_mean=12, a_mean=30, a_sigma=0.6)
    captions = _qa_text(rng, n, np.ones(n, dtype=np.int64), q_mean=8, a_mean=18, a_sigma=0.4)
    image_qa = _qa_text(rng, n, turns, q_mean=10, a_mean=45, a_sigma=0.6)
    text = _with_template(np.choose(source, [speech_qa, captions, image_qa]), counts + 1)
    return _rows(counts, heights, widths, text), [(int(f),) for f in frames.tolist()]


def _omni(rng: np.random.Generator, n: int) -> Rows:
    return _omni_with_audio(rng, n)[0]


_WITH_AUDIO = {"omni": _omni_with_audio}
"""The generators whose samples carry audio clips: ``(rng, n) -> (rows, audio per sample)``."""


Gen = Callable[[np.random.Generator, int], Rows]
_ZOO: dict[str, Gen] = {
    "docvqa": _docvqa,
    "multi-image": _multi_image,
    "video": _video,
    "text-heavy": _text_heavy,
    "long-context": _long_context,
    "mixture": _mixture,
    "anyres": _anyres,
    "omni": _omni,
}
ZOO: tuple[str, ...] = tuple(_ZOO)
"""The workload zoo (beyond the paper's four datasets)."""


def _paper_style(text_gen, image_gen) -> Gen:
    return lambda rng, n: _one_image(text_gen(rng, n), image_gen(rng, n))


_GENERATORS: dict[str, Gen] = {
    "synthchartnet": _paper_style(_synthchart_text, _synthchart_images),
    "chartqa": _paper_style(_chartqa_text, _chartqa_images),
    "cocoqa": _paper_style(_cocoqa_text, _coco_images),
    "llava150k": _paper_style(_llava_text, _coco_images),
    "synthchartnet-fv": _paper_style(_synthchart_text, _synthchart_fv_images),
    "skewed": _paper_style(_skewed_text, _skewed_images),
    **_ZOO,
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
    if name in _WITH_AUDIO:
        return _WITH_AUDIO[name](rng, BLOCK_SIZE)
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
