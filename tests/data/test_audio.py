"""Audio clips of LLaVA-format records: WAV files read as float mono, resampled to the feature
extractor's 16 kHz, log-mel features and frame / token counts as Qwen2.5-Omni's processor and audio
tower give them, and every bad file named with what is wrong with it (missing, empty, truncated,
unreadable)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.io import wavfile

from entrain.data.audio import (
    AudioFileError,
    audio_tokens,
    check_record_audio,
    clip_features,
    feature_extractor,
    load_clip,
    mel_frames,
    read_audio,
)


def _tone(rate: int, seconds: float, channels: int = 1) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    wave = 0.5 * np.sin(2 * np.pi * 440.0 * t)
    pcm = (wave * 32767).astype(np.int16)
    return np.stack([pcm] * channels, axis=1) if channels > 1 else pcm


def _write(path, rate: int, data: np.ndarray) -> str:
    wavfile.write(path, rate, data)
    return str(path)


def test_a_stereo_8khz_wav_is_mono_float_resampled_to_16khz(tmp_path):
    path = _write(tmp_path / "a.wav", 8000, _tone(8000, 0.5, channels=2))
    samples, rate = read_audio(path)
    assert rate == 8000 and samples.dtype == np.float32 and samples.ndim == 1
    assert abs(float(np.abs(samples).max()) - 0.5) < 1e-3
    clip = load_clip(path)
    assert clip.shape == (8000,)
    t = np.arange(8000) / 16000  # the same 440-Hz tone at the new rate (away from the filter's edges)
    assert np.abs(clip[500:-500] - 0.5 * np.sin(2 * np.pi * 440.0 * t[500:-500])).max() < 1e-2


def test_features_frames_and_tokens_are_the_processors(tmp_path):
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths

    extractor = feature_extractor(None, mel_bins=128)
    clips = [
        np.random.default_rng(i).standard_normal(n).astype(np.float32) * 0.1
        for i, n in enumerate((16000, 4321))
    ]
    feats = clip_features(clips, extractor)
    assert [f.shape for f in feats] == [(128, mel_frames(c.size)) for c in clips] == [(128, 100), (128, 28)]
    alone = extractor(
        clips[1], sampling_rate=16000, return_attention_mask=True, padding="max_length", return_tensors="np"
    )  # fmt: skip  (a clip's features do not depend on its batch)
    assert int(alone["attention_mask"].sum()) == 28
    np.testing.assert_allclose(feats[1], alone["input_features"][0, :, :28], rtol=1e-5, atol=1e-6)
    assert mel_frames(16000 * 31) == 3000  # cut at 30 s, as the processor does
    for frames in (1, 2, 3, 4, 5, 37, 100, 2999, 3000):
        assert audio_tokens(frames) == int(_get_feat_extract_output_lengths(np.array(frames)))


def test_every_bad_audio_file_is_named_with_its_problem(tmp_path):
    good = _write(tmp_path / "good.wav", 16000, _tone(16000, 0.2))
    data = open(good, "rb").read()
    (tmp_path / "truncated.wav").write_bytes(data[: len(data) // 2])
    (tmp_path / "zero.wav").write_bytes(b"")
    _write(tmp_path / "silent.wav", 16000, np.zeros(0, dtype=np.int16))
    (tmp_path / "junk.wav").write_bytes(data[:20])
    reasons = {}
    for name in ("truncated.wav", "zero.wav", "silent.wav", "junk.wav", "missing.wav"):
        with pytest.raises(AudioFileError) as e:
            read_audio(tmp_path / name)
        reasons[name] = e.value.reason
    assert reasons == {"truncated.wav": "truncated", "zero.wav": "empty", "silent.wav": "empty",
                       "junk.wav": "unreadable", "missing.wav": "missing"}  # fmt: skip
    record = {
        "id": "r1",
        "audio": ["good.wav", "truncated.wav", "missing.wav"],
        "conversations": [
            {"from": "human", "value": "<audio><audio> what is said?"},
            {"from": "gpt", "value": "hi"},
        ],
    }
    problems = dict(check_record_audio(record, tmp_path))
    assert set(problems) == {"audio[1]", "audio[2]", "audio"}
    assert problems["audio[1]"].startswith("truncated.wav: truncated")
    assert problems["audio[2]"] == "missing.wav: missing"
    assert "3 audio file(s) but 2 <audio> placeholder(s)" in problems["audio"]
    fine = {"audio": "good.wav", "conversations": [{"from": "human", "value": "<audio> hi"}]}
    assert check_record_audio(fine, tmp_path) == []
