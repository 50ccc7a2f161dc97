"""The workload zoo (names in docs/contract.md): each generator's distribution as docs/workloads.md
states it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from entrain.data.generators import generate_arrays, generate_samples
from entrain.data.zoo_generators import (
    LONG_CONTEXT_IMAGE_SHARE,
    LONG_CONTEXT_TOKENS,
    MIXTURE_WEIGHTS,
    MULTI_IMAGE_COUNT_WEIGHTS,
    TEXT_ONLY_SHARE,
    VIDEO_FRAME_MAX_PIXELS,
    ZOO,
)

N = 4000


def _draw(name: str):
    return generate_samples(name, N, seed=11)


def _col(samples, attr):
    return np.array([getattr(s, attr) for s in samples], dtype=float)


def test_docvqa_pages_are_large_scans_with_long_text():
    samples = _draw("docvqa")
    long_sides = np.array([max(h, w) for s in samples for h, w in s.images])
    assert all(len(s.images) == 1 for s in samples)
    assert long_sides.min() >= 800 and long_sides.max() <= 3500
    assert np.mean(long_sides >= 2000) > 0.5  # mostly 200-300 DPI letter scans
    portrait = np.mean([h > w for s in samples for h, w in s.images])
    assert portrait == pytest.approx(0.9, abs=0.03)
    text = _col(samples, "text_tokens")
    assert np.median(text) > 300 and np.percentile(text, 95) > 1000  # OCR text in the prompt
    assert np.mean(_col(samples, "vit_patches") / _col(samples, "llm_tokens")) > 3  # vision-heavy


def test_multi_image_counts_follow_their_weights():
    a = generate_arrays("multi-image", N, seed=11)
    assert a.image_counts.min() == 1 and a.image_counts.max() == 8
    weights = np.array(MULTI_IMAGE_COUNT_WEIGHTS)
    expected = (np.arange(1, 9) * weights).sum() / weights.sum()
    assert a.image_counts.mean() == pytest.approx(expected, abs=0.1)
    sides = np.concatenate([a.heights, a.widths])
    assert sides.max() <= 1536 and sides.min() >= 100


def test_video_frames_and_per_frame_cap():
    a = generate_arrays("video", N, seed=11)
    frames = 2 * a.image_counts  # one entry per temporal patch of two frames
    assert frames.min() >= 4 and frames.max() <= 32
    assert {8, 16, 32} <= set(frames.tolist())
    for images in a.images():
        assert len(set(images)) == 1  # every frame of a clip has the clip's size
        assert images[0][0] * images[0][1] <= VIDEO_FRAME_MAX_PIXELS
    assert np.median(a.text_tokens) < 150  # short text


def test_text_heavy_is_half_text_only_with_long_answers():
    samples = _draw("text-heavy")
    text_only = np.array([not s.images for s in samples])
    assert text_only.mean() == pytest.approx(TEXT_ONLY_SHARE, abs=0.03)
    text = _col(samples, "text_tokens")
    assert np.median(text[text_only]) > 300
    assert all(len(s.images) <= 1 for s in samples)


def test_long_context_is_llm_dominant():
    samples = _draw("long-context")
    lo, hi = LONG_CONTEXT_TOKENS
    text = _col(samples, "text_tokens")
    assert text.min() >= lo and text.max() <= hi
    assert np.median(text) == pytest.approx(math.sqrt(lo * hi), rel=0.08)  # log-uniform
    with_image = [s for s in samples if s.images]
    assert len(with_image) / N == pytest.approx(LONG_CONTEXT_IMAGE_SHARE, abs=0.03)
    assert all(len(s.images) == 1 and max(s.images[0]) <= 448 for s in with_image)
    assert _col(samples, "image_tokens").sum() < 0.02 * _col(samples, "llm_tokens").sum()


def test_mixture_draws_from_every_source():
    samples = _draw("mixture")
    text_only = np.mean([not s.images for s in samples])
    expected = MIXTURE_WEIGHTS["text-heavy"] * TEXT_ONLY_SHARE + MIXTURE_WEIGHTS["long-context"] * (
        1 - LONG_CONTEXT_IMAGE_SHARE
    )
    assert text_only == pytest.approx(expected / sum(MIXTURE_WEIGHTS.values()), abs=0.03)
    counts = np.array([len(s.images) for s in samples])
    assert counts.max() > 8  # videos
    assert np.mean(_col(samples, "text_tokens") >= 2048) > 0.15  # long contexts


def test_zoo_order_of_vision_load():
    """docvqa and video are vision-heavy, long-context and text-heavy LLM-heavy (the zoo's purpose)."""
    ratio = {}
    for name in ZOO:
        samples = generate_samples(name, 1000, seed=2)
        ratio[name] = _col(samples, "vit_patches").sum() / _col(samples, "llm_tokens").sum()
    assert min(ratio["docvqa"], ratio["video"], ratio["multi-image"]) > 3
    assert ratio["long-context"] < 0.1 and ratio["text-heavy"] < 1
