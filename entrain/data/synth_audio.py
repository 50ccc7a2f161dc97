"""The sounds ``entrain data synth --dataset omni`` writes: real 16-kHz PCM WAV files synthesised from
seeded numbers (no recordings ship in a wheel), each with a caption and facts its questions are written
from (``Sound``, the ``Photo`` of an audio clip):

- ``speech``: voiced syllables (a glottal pulse train at a speaker's pitch through three vowel
  formants) at about four syllables a second, with pauses: speech-like, not words;
- ``birdsong``: short rising and falling chirps between 2 and 6 kHz over light wind noise;
- ``rain``: low-pass filtered noise with random drops;
- ``bell``: struck bells, inharmonic partials decaying exponentially;
- ``engine``: a low hum with harmonics and amplitude flutter over rumble.

A clip of ``frames`` mel frames has ``frames * 160`` samples, so ``entrain.data.audio.mel_frames``
counts exactly ``frames`` (the generator's draw)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from entrain.data.audio import HOP_LENGTH, SAMPLING_RATE

__all__ = ["SOUNDS", "Sound", "sound_samples", "write_sound"]


@dataclass(frozen=True)
class Sound:
    kind: str
    caption: str
    subject: str
    qa: tuple[tuple[str, str], ...]
    facts: tuple[str, ...]


SOUNDS: tuple[Sound, ...] = (
    Sound("speech", "A person speaks in a calm, even voice.", "the speaker",
          (("how many people speak", "one"), ("is the voice calm or excited", "calm"),
           ("is there music in the background", "no")),
          ("One person speaks at a steady pace.", "The voice is calm and even.", "Short pauses separate the phrases.",
           "There is no background music.")),
    Sound("birdsong", "Birds chirp over a light wind.", "the birds",
          (("what animals are heard", "birds"), ("is it windy", "slightly"), ("are the chirps high or low", "high")),
          ("Several short high chirps repeat.", "A light wind blows in the background.",
           "The chirps rise and fall in pitch.", "No people can be heard.")),
    Sound("rain", "Rain falls steadily on a roof.", "the rain",
          (("what is the weather", "rain"), ("is the rain light or heavy", "steady"), ("is there thunder", "no")),
          ("Rain patters steadily.", "Single drops hit a hard surface now and then.", "There is no thunder.",
           "The sound stays even throughout.")),
    Sound("bell", "A bell is struck several times and rings out.", "the bell",
          (("what instrument is heard", "bell"), ("how does each ring end", "it fades"), ("is it a drum", "no")),
          ("A metal bell is struck again and again.", "Each ring fades slowly.", "The tone is bright and clear.",
           "Nothing else can be heard between the rings.")),
    Sound("engine", "An engine idles with a low hum.", "the engine",
          (("what machine is heard", "engine"), ("is the sound high or low", "low"), ("does it stop", "no")),
          ("An engine idles at a steady speed.", "The hum is low and rough.", "The sound flutters slightly.",
           "It keeps running to the end of the clip.")),
)  # fmt: skip


def _speech(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    f0 = rng.uniform(100, 230)
    syllable = 0.25
    out = np.zeros_like(t)
    formants = [(730, 1090, 2440), (270, 2290, 3010), (570, 840, 2410), (300, 870, 2240), (530, 1840, 2480)]
    for start in np.arange(0, t[-1] + 1e-9, syllable):
        if rng.random() < 0.15:  # a pause
            continue
        idx = (t >= start) & (t < start + syllable * 0.85)
        if not idx.any():
            continue
        local = t[idx] - start
        pitch = f0 * (1 + 0.08 * np.sin(2 * math.pi * local / syllable))
        phase = 2 * math.pi * np.cumsum(pitch) / SAMPLING_RATE
        f1, f2, f3 = formants[int(rng.integers(len(formants)))]
        tone = np.zeros_like(local)
        for h in range(1, int(4000 // f0)):
            f = h * f0
            gain = sum(math.exp(-(((f - fm) / 120) ** 2)) for fm in (f1, f2, f3)) + 0.02
            tone += gain * np.sin(h * phase) / h
        out[idx] = tone * np.sin(math.pi * local / (syllable * 0.85))
    return out


def _birdsong(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    out = 0.02 * _lowpass(rng.normal(size=t.size), 40)
    for start in np.sort(rng.uniform(0, t[-1], max(1, int(t[-1] * 3)))):
        idx = (t >= start) & (t < start + 0.12)
        local = t[idx] - start
        f = rng.uniform(2000, 4000) + rng.choice([-1, 1]) * rng.uniform(500, 2000) * local / 0.12
        out[idx] += 0.5 * np.sin(2 * math.pi * np.cumsum(f) / SAMPLING_RATE) * np.sin(math.pi * local / 0.12)
    return out


def _lowpass(x: np.ndarray, width: int) -> np.ndarray:
    return np.convolve(x, np.ones(width) / width, mode="same")


def _rain(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    out = 0.3 * _lowpass(rng.normal(size=t.size), 6)
    drops = rng.integers(0, t.size, max(1, int(t[-1] * 20)))
    out[drops] += rng.uniform(0.3, 0.8, drops.size)
    return _lowpass(out, 3)


def _bell(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    out = np.zeros_like(t)
    base = rng.uniform(300, 900)
    for start in np.arange(0, t[-1] + 1e-9, rng.uniform(0.8, 2.0)):
        local = np.clip(t - start, 0, None)
        on = t >= start
        for ratio, gain in ((1.0, 1.0), (2.76, 0.5), (5.4, 0.25), (8.93, 0.12)):
            out += on * gain * np.exp(-local * 2.5 * ratio**0.5) * np.sin(2 * math.pi * base * ratio * local)
    return out


def _engine(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    f = rng.uniform(30, 60)
    flutter = 1 + 0.2 * np.sin(2 * math.pi * rng.uniform(3, 8) * t)
    hum = sum(np.sin(2 * math.pi * h * f * t) / h for h in range(1, 8))
    return hum * flutter + 0.3 * _lowpass(rng.normal(size=t.size), 20)


_SYNTH = {"speech": _speech, "birdsong": _birdsong, "rain": _rain, "bell": _bell, "engine": _engine}


def sound_samples(sound: Sound, frames: int, rng: np.random.Generator) -> np.ndarray:
    """``frames * HOP_LENGTH`` 16-bit mono samples at 16 kHz of ``sound``, peak -3 dBFS."""
    t = np.arange(int(frames) * HOP_LENGTH) / SAMPLING_RATE
    wave = _SYNTH[sound.kind](rng, t)
    wave = wave / max(1e-9, float(np.abs(wave).max())) * 0.7
    return (wave * 32767).astype(np.int16)


def write_sound(sound: Sound, frames: int, rng: np.random.Generator, path: Path) -> None:
    """``sound_samples`` as a WAV file at ``path``."""
    from scipy.io import wavfile

    samples = sound_samples(sound, frames, rng)
    path.parent.mkdir(parents=True, exist_ok=True)
    wavfile.write(path, SAMPLING_RATE, samples)
