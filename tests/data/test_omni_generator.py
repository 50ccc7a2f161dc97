"""The ``omni`` generator (docs/workloads.md): one audio clip a sample, from its four sources in their
stated shares (a photo only with a spoken question, a video only with its audio track), clip lengths as
documented (AudioCaps' 10-s clips, Clotho's 15-30 s, speech-QA passages around LibriSpeech's 12 s,
VGGSound's 10-s videos, nothing past the processor's 30 s), every statistic of the calibration table in
docs/workloads.md within its bounds, slice-consistent with its audio."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from entrain.data.generators import generate_samples
from entrain.data.zoo_generators import AUDIOCAPS_SHARE, OMNI_SOURCE_WEIGHTS, SPEECH_MEAN_SECONDS

DOC = Path(__file__).parents[2] / "docs" / "workloads.md"


def _draw(n: int = 4000, seed: int = 0):
    samples = generate_samples("omni", n, seed=seed)
    images = np.array([len(s.images) for s in samples])
    seconds = np.array([s.audio[0] for s in samples]) / 100
    return samples, images, seconds


def test_omni_sources_and_clip_lengths():
    samples, images, seconds = _draw(4000, seed=1)
    assert all(len(s.audio) == 1 and 1 <= s.audio[0] <= 3000 for s in samples)
    one, video, alone = images == 1, images >= 2, images == 0
    assert one.mean() == pytest.approx(OMNI_SOURCE_WEIGHTS["image-audio"], abs=0.03)
    assert video.mean() == pytest.approx(OMNI_SOURCE_WEIGHTS["video-audio"], abs=0.03)
    assert seconds[one].max() <= 15  # spoken questions
    assert all(len(set(s.images)) == 1 for s in np.array(samples, dtype=object)[video])  # one frame size
    ten = np.isclose(seconds[alone], 10.0).mean()  # AudioCaps' clips (speech passages almost never)
    audio_only = OMNI_SOURCE_WEIGHTS["speech-qa"] + OMNI_SOURCE_WEIGHTS["audio-caption"]
    assert ten == pytest.approx(AUDIOCAPS_SHARE * OMNI_SOURCE_WEIGHTS["audio-caption"] / audio_only, abs=0.03)
    other = seconds[alone & ~np.isclose(seconds, 10.0)]
    assert np.median(other) == pytest.approx(SPEECH_MEAN_SECONDS, rel=0.25) and other.max() <= 30
    assert all(s.audio_tokens > 0 for s in samples)


def test_a_video_track_spans_its_frames():
    """A T-second video is T temporal patches (2 fps, 2 frames a patch) and its track 100 T mel frames;
    its text counts the video's and the track's markers (4 tokens)."""
    samples, images, _ = _draw(1000)
    videos = [s for s, k in zip(samples, images) if k >= 2]
    assert videos and all(s.audio[0] == 100 * len(s.images) for s in videos)
    assert min(s.text_tokens for s in videos) >= 11 + 4 + 10 + 2


def _doc_bounds() -> dict[str, tuple[float, float]]:
    """The omni section's calibration table: statistic -> (low, high)."""
    text = DOC.read_text()
    section = text[text.index("## `omni`") :]
    section = section[: section.index("\n## ")]
    rows = re.findall(r"^\| `(\w+)`.*\| ([\d.]+) - ([\d.]+) \|$", section, re.M)
    return {name: (float(lo), float(hi)) for name, lo, hi in rows}


def _statistics(samples, images, seconds) -> dict[str, float]:
    one, video, alone = images == 1, images >= 2, images == 0
    speech = alone & ~np.isclose(seconds, 10.0) & (seconds < 15)
    per_patch = [s.audio[0] / len(s.images) for s, v in zip(samples, video) if v]
    return {
        "image_audio_share": one.mean(),
        "video_audio_share": video.mean(),
        "audio_only_ten_second_share": np.isclose(seconds[alone], 10.0).mean(),
        "speech_under_15s_mean_seconds": seconds[speech].mean(),
        "spoken_question_mean_seconds": seconds[one].mean(),
        "video_ten_second_share": np.isclose(seconds[video], 10.0).mean(),
        "video_mean_seconds": seconds[video].mean(),
        "video_track_frames_per_patch": min(per_patch) if min(per_patch) != 100 else max(per_patch),
        "mean_text_tokens": np.mean([s.text_tokens for s in samples]),
    }


def test_omni_stays_within_its_documented_calibration_bounds():
    bounds = _doc_bounds()
    stats = _statistics(*_draw())
    assert sorted(bounds) == sorted(stats), (
        "docs/workloads.md's omni table and this test name other statistics"
    )
    outside = {
        k: (round(float(v), 4), bounds[k]) for k, v in stats.items() if not bounds[k][0] <= v <= bounds[k][1]
    }
    assert not outside, f"omni statistics outside docs/workloads.md's bounds: {outside}"


def test_omni_slices_keep_their_audio():
    whole = generate_samples("omni", 600, seed=2)
    assert generate_samples("omni", 50, seed=2, start=500) == whole[500:550]
