"""The ``omni`` generator (docs/workloads.md): one audio clip a sample, from its three sources in their
stated shares (a photo only with a spoken question), clip lengths as documented (AudioCaps' 10-s clips,
Clotho's 15-30 s, speech-QA passages around LibriSpeech's 12 s, nothing past the processor's 30 s),
slice-consistent with its audio."""

from __future__ import annotations

import numpy as np
import pytest

from entrain.data.generators import generate_samples
from entrain.data.zoo_generators import AUDIOCAPS_SHARE, OMNI_SOURCE_WEIGHTS, SPEECH_MEAN_SECONDS


def test_omni_sources_and_clip_lengths():
    samples = generate_samples("omni", 4000, seed=1)
    assert all(len(s.audio) == 1 and 1 <= s.audio[0] <= 3000 for s in samples)
    seconds = np.array([s.audio[0] for s in samples]) / 100
    with_image = np.array([len(s.images) == 1 for s in samples])
    assert with_image.mean() == pytest.approx(OMNI_SOURCE_WEIGHTS["image-audio"], abs=0.03)
    assert seconds[with_image].max() <= 15  # spoken questions
    ten = np.isclose(seconds[~with_image], 10.0).mean()  # AudioCaps' clips (speech passages almost never)
    assert ten == pytest.approx(
        AUDIOCAPS_SHARE * OMNI_SOURCE_WEIGHTS["audio-caption"] / (1 - OMNI_SOURCE_WEIGHTS["image-audio"]),
        abs=0.03,
    )
    other = seconds[~with_image & ~np.isclose(seconds, 10.0)]
    assert np.median(other) == pytest.approx(SPEECH_MEAN_SECONDS, rel=0.25) and other.max() <= 30
    assert all(s.audio_tokens > 0 for s in samples)


def test_omni_slices_keep_their_audio():
    whole = generate_samples("omni", 600, seed=2)
    assert generate_samples("omni", 50, seed=2, start=500) == whole[500:550]
