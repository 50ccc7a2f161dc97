"""Seeded draws the built-in generators share (``entrain.data.generators``): a lognormal by its mean,
token rounding, categorical choice, regime runs in data order, and the chat template's token counts
(``11 + 2*n_images + sum_turns(10 + q + a)``, docs/workloads.md); a block of samples as ``Rows``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

SYSTEM_TOKENS = 11
"""Qwen2 chat template's default system block."""
TURN_TOKENS = 10
"""Template tokens of one user + assistant turn."""
VISION_MARKER_TOKENS = 2
"""``<|vision_start|>`` + ``<|vision_end|>`` per image."""

Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""A block of samples: ``(image_counts, heights, widths, text_tokens)``, images flattened."""

Gen = Callable[[np.random.Generator, int], Rows]
"""A generator: ``(rng, n) -> Rows`` of ``n`` samples."""


def lognormal(rng: np.random.Generator, mean: float, sigma: float, size) -> np.ndarray:
    """Lognormal with the given *mean* (not median) and log-sd ``sigma``."""
    return rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, size)


def tokens(x: np.ndarray, lo: int = 1) -> np.ndarray:
    """Round half to even (like Python's ``round``) and floor at ``lo``."""
    return np.maximum(lo, np.rint(x)).astype(np.int64)


def choice(rng: np.random.Generator, probs: list[float], size: int) -> np.ndarray:
    """``size`` indices into ``probs``, drawn with those weights (normalised)."""
    p = np.asarray(probs, dtype=float)
    return rng.choice(len(p), size=size, p=p / p.sum())


def turn_sums(k: np.ndarray, q: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Template + question + answer tokens of the first ``k[i]`` turns of row ``i``."""
    used = np.arange(q.shape[1])[None, :] < k[:, None]
    return ((TURN_TOKENS + q + a) * used).sum(axis=1)


def text_total(turn_tokens: np.ndarray) -> np.ndarray:
    """A one-image sample's text tokens: its turns plus the system block and the image's markers."""
    return (SYSTEM_TOKENS + VISION_MARKER_TOKENS + turn_tokens).astype(np.int64)


def regimes(rng: np.random.Generator, n: int, weights: list[float], mean_run: float) -> np.ndarray:
    """Regime index per position in data order: runs of geometric length (mean ``mean_run``), each
    run's regime drawn independently from ``weights``."""
    new_run = rng.random(n) < 1.0 / mean_run
    new_run[0] = True
    run_id = np.cumsum(new_run) - 1
    run_regime = choice(rng, weights, n)  # one draw per possible run
    return run_regime[run_id]


def one_image(text: np.ndarray, hw: tuple[np.ndarray, np.ndarray]) -> Rows:
    """Rows of one image a sample, of sizes ``hw = (heights, widths)``."""
    return np.ones(text.shape[0], dtype=np.int64), hw[0], hw[1], text


def rows_from(counts: np.ndarray, heights: np.ndarray, widths: np.ndarray, text: np.ndarray) -> Rows:
    """Rows from per-sample ``counts`` and per-slot ``(n, max_count)`` sizes (first ``counts[i]`` used)."""
    used = np.arange(heights.shape[1])[None, :] < counts[:, None]
    return counts.astype(np.int64), heights[used].astype(np.int64), widths[used].astype(np.int64), text


def qa_text(rng: np.random.Generator, n: int, turns: np.ndarray, q_mean: float, a_mean: float,
            a_sigma: float, a_max: int = 8192) -> np.ndarray:  # fmt: skip
    """Template + question + answer tokens of ``turns[i]`` turns (lognormal questions and answers)."""
    width = int(turns.max()) if n else 1
    q = tokens(lognormal(rng, q_mean, 0.5, (n, width)))
    a = np.minimum(a_max, tokens(lognormal(rng, a_mean, a_sigma, (n, width))))
    return turn_sums(turns, q, a)


def with_template(turn_tokens: np.ndarray, visual_items: np.ndarray) -> np.ndarray:
    """``11 + 2 * visual_items + turns`` (a video is one visual item: one start/end marker pair)."""
    return (SYSTEM_TOKENS + VISION_MARKER_TOKENS * visual_items + turn_tokens).astype(np.int64)


def split_samples(rows: Rows) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Per sample of ``rows``: its images' heights and widths, and its text tokens."""
    counts, heights, widths, text = rows
    ends = np.cumsum(counts)
    return [(heights[e - c : e], widths[e - c : e], int(t)) for c, e, t in zip(counts, ends, text)]


def join_samples(samples: list[tuple[np.ndarray, np.ndarray, int]]) -> Rows:
    """Rows of ``samples`` (``split_samples``' form), in order."""
    empty = np.zeros(0, dtype=np.int64)
    counts = np.array([len(h) for h, _, _ in samples], dtype=np.int64)
    heights = np.concatenate([empty, *(h for h, _, _ in samples)]).astype(np.int64)
    widths = np.concatenate([empty, *(w for _, w, _ in samples)]).astype(np.int64)
    return counts, heights, widths, np.array([t for _, _, t in samples], dtype=np.int64)
