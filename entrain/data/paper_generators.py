"""Generators of the paper's datasets (SynthChartNet, ChartQA, COCO-QA, LLaVA-150K) and of
``synthchartnet-fv`` and ``skewed``: one image a sample (pure numpy; ``entrain.data.generators``
draws them).

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
"""

from __future__ import annotations

import math

import numpy as np

from entrain.data.generator_draws import (
    TURN_TOKENS,
    Gen,
    choice,
    lognormal,
    one_image,
    regimes,
    text_total,
    tokens,
    turn_sums,
)

# --- text generators (FineVision-calibrated) ------------------------------------------------------


def _llava_text(rng: np.random.Generator, n: int) -> np.ndarray:
    subset = choice(rng, [0.362, 0.148, 0.490], n)  # conversation / detail / complex reasoning
    k_conv = 1 + choice(rng, [0.02, 0.12, 0.20, 0.20, 0.18, 0.13, 0.08, 0.04, 0.02, 0.01], n)
    conv = turn_sums(
        k_conv, tokens(lognormal(rng, 12, 0.35, (n, 10))), tokens(lognormal(rng, 58, 0.6, (n, 10)), 2)
    )
    detail = TURN_TOKENS + tokens(lognormal(rng, 10, 0.2, n)) + tokens(lognormal(rng, 122, 0.3, n), 20)
    complex_ = TURN_TOKENS + tokens(lognormal(rng, 16.5, 0.35, n)) + tokens(lognormal(rng, 147, 0.35, n), 20)
    return text_total(np.choose(subset, [conv, detail, complex_]))


def _chartqa_text(rng: np.random.Generator, n: int) -> np.ndarray:
    k = 1 + choice(rng, [0.50, 0.45, 0.05], n)
    return text_total(
        turn_sums(k, tokens(lognormal(rng, 22.1, 0.3, (n, 3))), tokens(lognormal(rng, 4.8, 0.6, (n, 3))))
    )


def _cocoqa_text(rng: np.random.Generator, n: int) -> np.ndarray:
    k = 1 + choice(rng, [0.48, 0.37, 0.12, 0.03], n)
    answers = np.minimum(8, 1 + rng.poisson(1.7, (n, 4)))
    return text_total(turn_sums(k, tokens(lognormal(rng, 14.4, 0.25, (n, 4))), answers))


def _synthchart_text(rng: np.random.Generator, n: int) -> np.ndarray:
    question = np.where(rng.random(n) < 0.66, 4, 5)
    answer = np.clip(lognormal(rng, 135, 0.45, n), 30, 1200).astype(np.int64)
    return text_total(TURN_TOKENS + question + answer)


# --- image generators: return (heights, widths) ---------------------------------------------------

_COCO_SIZES = [  # (W, H), weight: the common Flickr-640 sizes of COCO
    ((640, 480), 0.35), ((640, 427), 0.27), ((480, 640), 0.08), ((427, 640), 0.08), ((640, 426), 0.03),
    ((640, 428), 0.03), ((500, 375), 0.03), ((640, 640), 0.025), ((612, 612), 0.015),
]  # fmt: skip


def coco_images(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """COCO photos' ``(heights, widths)``: the common sizes, then small, panoramic and near-square tails."""
    u = rng.random(n)
    cat = choice(rng, [p for _, p in _COCO_SIZES], n)
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
    source = regimes(rng, n, [0.60, 0.30, 0.10], _CHARTQA_MEAN_RUN_SAMPLES)
    statista_h = np.clip(rng.normal(560, 50, n), 380, 900).astype(np.int64)
    pew_w = np.array([310, 420, 640, 800])[choice(rng, [0.35, 0.30, 0.20, 0.15], n)]
    pew_h = (pew_w * np.clip(lognormal(rng, 1.15, 0.35, n), 0.5, 2.6)).astype(np.int64)
    owid_h = np.clip(rng.normal(600, 40, n), 450, 750).astype(np.int64)
    w = np.choose(source, [np.full(n, 800), pew_w, np.full(n, 850)])
    h = np.choose(source, [statista_h, pew_h, owid_h])
    return h, w


def _synthchart_fv_images(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """FineVision-size SynthChartNet: 120-DPI Matplotlib/Seaborn figures or Pyecharts' 900x500."""
    fig = choice(rng, [0.7, 0.2, 0.1], n)  # 6.4x4.8 / 8x6 / 10x6 inches at 120 DPI
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


def synthchart_images(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """SynthChartNet charts' ``(heights, widths)``, in data-order runs of one chart family."""
    family = regimes(rng, n, _FAMILY_WEIGHTS, _MEAN_RUN_SAMPLES)
    aspect = np.array(_ASPECTS)[choice(rng, [0.5, 0.25, 0.25], n)]
    compact_w = rng.uniform(*_COMPACT_WIDTH_PX, n).astype(np.int64)
    hires_w = rng.uniform(*_HIRES_WIDTH_PX, n).astype(np.int64)
    cat = choice(rng, [p for _, p in _DEFAULT_SIZES], n)
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


def _paper_style(text_gen, image_gen) -> Gen:
    return lambda rng, n: one_image(text_gen(rng, n), image_gen(rng, n))


PAPER_GENERATORS: dict[str, Gen] = {
    "synthchartnet": _paper_style(_synthchart_text, synthchart_images),
    "chartqa": _paper_style(_chartqa_text, _chartqa_images),
    "cocoqa": _paper_style(_cocoqa_text, coco_images),
    "llava150k": _paper_style(_llava_text, coco_images),
    "synthchartnet-fv": _paper_style(_synthchart_text, _synthchart_fv_images),
    "skewed": _paper_style(_skewed_text, _skewed_images),
}
"""The paper's datasets' generators by name (and ``synthchartnet-fv``, ``skewed``)."""
