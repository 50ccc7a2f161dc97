"""Audio clips of LLaVA-format records: ``"audio": "clip.wav"`` (or a list of paths) and one
``<audio>`` placeholder in the conversation per clip, in order; in a shard the clip may be stored inside
it (``entrain.data.records.ImageRef``: a WebDataset member, Parquet / Arrow bytes), read alike.

* ``read_audio``: one file as float32 mono samples and its sampling rate, read with SciPy's WAV reader
  (``scipy.io.wavfile``; PCM 8/16/24/32-bit and float WAV); another format is read with
  ``soundfile`` where it is installed. An unusable file raises ``AudioFileError`` whose ``reason``
  names what is wrong with it: ``missing``, ``empty`` (no samples), ``truncated`` (fewer bytes than
  its header declares), ``unreadable`` (no valid header), ``unsupported format``.
* ``load_clip``: a file at the rate the feature extractor expects (16 kHz, ``SAMPLING_RATE``),
  resampled by polyphase filtering (``scipy.signal.resample_poly``) where it has another rate;
  transformers' ``WhisperFeatureExtractor`` refuses any other rate, and its ``load_audio`` resamples
  (with librosa) before it too.
* ``clip_features``: the log-mel features of clips as Qwen2.5-Omni's processor computes them:
  ``WhisperFeatureExtractor(..., sampling_rate=16000, return_attention_mask=True,
  padding="max_length")``, each clip's valid frames (``mel_frames``; a clip past 30 s is cut there,
  as the processor does).
* ``audio_tokens``: the LLM tokens of a clip's frames (the audio tower's two stride-2 reductions).
* ``check_record_audio``: every bad audio file of one record, and a placeholder count that does not
  match its clips (what ``data check`` reports).
"""

from __future__ import annotations

import io
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from entrain.data.records import ImageRef, media_file

__all__ = ["AUDIO_PLACEHOLDER", "SAMPLING_RATE", "HOP_LENGTH", "MAX_FRAMES", "AudioFileError", "read_audio",
           "resample", "load_clip", "mel_frames", "audio_tokens", "feature_extractor", "clip_features",
           "audio_paths", "check_record_audio"]  # fmt: skip

AUDIO_PLACEHOLDER = "<audio>"
SAMPLING_RATE = 16_000
"""The rate Whisper's feature extractor (Qwen2.5-Omni's) takes."""
HOP_LENGTH = 160
"""Samples per mel frame (10 ms at 16 kHz)."""
MAX_FRAMES = 3_000
"""Frames of a 30-s window: the processor pads every clip to it and cuts a longer one there."""


class AudioFileError(ValueError):
    """An audio file that cannot be used; ``reason`` says why, ``path`` names it."""

    def __init__(self, path: str, reason: str, detail: str = ""):
        self.path, self.reason, self.detail = str(path), reason, detail
        super().__init__(f"{path}: {reason}" + (f" ({detail})" if detail else ""))


def _as_float(data: np.ndarray) -> np.ndarray:
    """Samples in [-1, 1] as float32 (integer PCM scaled by its range; 8-bit PCM is unsigned)."""
    if data.dtype == np.uint8:
        return (data.astype(np.float32) - 128.0) / 128.0
    if np.issubdtype(data.dtype, np.integer):
        return data.astype(np.float32) / float(np.iinfo(data.dtype).max + 1)
    return data.astype(np.float32)


def _read_other(source, name: str) -> tuple[np.ndarray, int]:
    try:
        import soundfile
    except ImportError:
        raise AudioFileError(
            name, "unsupported format", "not a WAV file; install soundfile to read FLAC, OGG or MP3"
        ) from None
    try:
        data, rate = soundfile.read(source, dtype="float32", always_2d=False)
    except (RuntimeError, soundfile.LibsndfileError) as e:
        raise AudioFileError(name, "unreadable", str(e)) from None
    return np.asarray(data), int(rate)


def _opened(src) -> tuple[str | io.BytesIO, str, bytes]:
    """``(what the readers open, the file's name for messages, its first 12 bytes)`` of a path or a
    file inside a shard (``ImageRef``); AudioFileError for a missing or empty one."""
    name = str(src)
    if isinstance(src, ImageRef):
        try:
            source = media_file(src)
        except OSError as e:
            raise AudioFileError(name, "unreadable", " ".join(str(e).split())) from None
        head = source.getvalue()[:12]
    else:
        if not os.path.isfile(name):
            raise AudioFileError(name, "missing")
        source = name
        with open(name, "rb") as f:
            head = f.read(12)
    if not head:
        raise AudioFileError(name, "empty", "0 bytes")
    return source, name, head


def read_audio(path: str | os.PathLike | ImageRef) -> tuple[np.ndarray, int]:
    """``(samples [n] float32 mono, rate)`` of an audio file, or of one inside a shard (``ImageRef``),
    channels averaged; AudioFileError otherwise (module docstring)."""
    from scipy.io import wavfile

    source, path, head = _opened(path)
    if not (head[:4] in (b"RIFF", b"RIFX", b"RF64") and head[8:12] == b"WAVE"):
        data, rate = _read_other(source, path)
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                rate, data = wavfile.read(source)
            except Exception as e:  # noqa: BLE001 - scipy raises several kinds for a bad header
                raise AudioFileError(path, "unreadable", str(e) or type(e).__name__) from None
        early = [str(w.message) for w in caught if "prematurely" in str(w.message)]
        if early:
            raise AudioFileError(path, "truncated", early[0])
        data = _as_float(np.asarray(data))
    if data.ndim == 2:
        data = data.mean(axis=1)
    if data.size == 0:
        raise AudioFileError(path, "empty", "no samples")
    if rate <= 0:
        raise AudioFileError(path, "unreadable", f"sampling rate {rate}")
    return data.astype(np.float32), int(rate)


def resample(samples: np.ndarray, rate: int, target: int = SAMPLING_RATE) -> np.ndarray:
    """``samples`` at ``rate`` Hz as ``target`` Hz (polyphase, ``scipy.signal.resample_poly``)."""
    if rate == target:
        return samples
    from scipy.signal import resample_poly

    g = math.gcd(int(rate), int(target))
    return resample_poly(samples, target // g, int(rate) // g).astype(np.float32)


def load_clip(path: str | os.PathLike | ImageRef) -> np.ndarray:
    """A file's (or a clip inside a shard's) samples at ``SAMPLING_RATE`` (float32 mono)."""
    samples, rate = read_audio(path)
    return resample(samples, rate)


def mel_frames(num_samples: int) -> int:
    """Valid mel frames of a 16-kHz clip of ``num_samples`` samples (what the feature extractor's
    attention mask counts), at most ``MAX_FRAMES``."""
    return min(MAX_FRAMES, -(-int(num_samples) // HOP_LENGTH))


def audio_tokens(frames: int) -> int:
    """LLM tokens of ``frames`` mel frames (the audio tower's two stride-2 reductions)."""
    return ((int(frames) - 1) // 2 + 1 - 2) // 2 + 1


def feature_extractor(folder: str | None = None, mel_bins: int = 128):
    """The checkpoint folder's ``WhisperFeatureExtractor`` (its ``preprocessor_config.json``), else
    Whisper's with ``mel_bins`` mel bins (Qwen2.5-Omni's: 128)."""
    from transformers import WhisperFeatureExtractor

    if folder and os.path.isfile(os.path.join(folder, "preprocessor_config.json")):
        try:
            return WhisperFeatureExtractor.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return WhisperFeatureExtractor(feature_size=mel_bins)


def clip_features(clips: Sequence[np.ndarray], extractor: Any) -> list[np.ndarray]:
    """Per 16-kHz clip, its ``[mel_bins, frames]`` float32 log-mel features as Qwen2.5-Omni's processor
    computes them (padded to 30 s, the valid frames kept)."""
    if not clips:
        return []
    out = extractor(list(clips), sampling_rate=SAMPLING_RATE, return_attention_mask=True, padding="max_length",
                    return_tensors="np")  # fmt: skip
    feats, mask = out["input_features"], out["attention_mask"]
    return [np.asarray(f[:, : int(m.sum())], dtype=np.float32) for f, m in zip(feats, mask)]


def audio_paths(record: dict) -> list[str | ImageRef]:
    """The record's ``audio`` (or ``audios``) field as a list of paths (a string, a list of strings, or
    absent), a shard's reader's clips (``ImageRef``) among them."""
    key = "audio" if "audio" in record else "audios"
    value = record.get(key)
    if value is None:
        return []
    if isinstance(value, (str, ImageRef)):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, ImageRef)) for v in value):
        return list(value)
    raise ValueError(f"{key!r} must be a path or a list of paths, not {type(value).__name__}")


def _placeholders(record: dict) -> int:
    turns = record.get("conversations") or record.get("messages") or []
    text = [t.get("value", t.get("content", "")) for t in turns if isinstance(t, dict)]
    return sum(s.count(AUDIO_PLACEHOLDER) for s in text if isinstance(s, str))


def check_record_audio(
    record: dict, root: str | os.PathLike, *, placeholders: bool = True
) -> list[tuple[str, str]]:
    """``(field, problem)`` of every bad audio file of ``record`` (paths relative to ``root``; the field
    ``audio[i]`` of a list, ``audio`` of one path; the problem names the file and what is wrong with
    it), and with ``placeholders`` of an ``<audio>`` placeholder count differing from its clips;
    empty when all is well."""
    key = "audio" if "audio" in record else "audios"
    try:
        paths = audio_paths(record)
    except ValueError as e:
        return [(key, str(e))]
    problems = []
    listed = isinstance(record.get(key), (list, tuple))
    for i, p in enumerate(paths):
        try:
            read_audio(p if isinstance(p, ImageRef) else Path(root) / p)
        except AudioFileError as e:
            problems.append(
                (
                    f"{key}[{i}]" if listed else key,
                    f"{p}: {e.reason}" + (f" ({e.detail})" if e.detail else ""),
                )
            )
    found = _placeholders(record)
    if placeholders and paths and found != len(paths):
        problems.append((key, f"{len(paths)} audio file(s) but {found} {AUDIO_PLACEHOLDER} placeholder(s)"))
    return problems
