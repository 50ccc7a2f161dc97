"""Video files of LLaVA-format records: ``"video": "clip.mp4"`` (or a list of paths) and one ``<video>``
placeholder in the conversation per video, in order; ``"use_audio_in_video": true`` also feeds each
video's audio track (Qwen2.5-Omni's ``use_audio_in_video`` / ``load_audio_from_video``).

Decoded with PyAV (FFmpeg), as transformers' ``pyav`` video backend reads a file: frames as
``rgb24`` arrays, the stream's ``average_rate`` as its fps. What a video becomes follows
transformers' Qwen2-VL video processor (``Qwen2VLVideoProcessor``, which Qwen2.5-VL and the
Qwen2.5-Omni processor use):

* ``sample_indices``: its ``sample_frames`` with ``fps`` (2 frames a second, Qwen's default; the
  Qwen2.5-Omni processor assumes that rate when it sets a video's seconds per temporal patch):
  ``total / video_fps * fps`` frames, at least ``min_frames`` (4), at most ``max_frames`` (768) and the
  video's own frames, rounded down to a multiple of ``temporal_patch_size`` (2), spread uniformly;
* ``video_grid``: the frames resized by ``smart_resize`` with the video pixel limits (128 to 768
  merged 28 x 28 tokens a frame, the processor's defaults; a checkpoint's
  ``video_preprocessor_config.json`` overrides them) and cut into ``(t, h, w)`` patches;
* ``process_frames``: the resize (torchvision's tensor bicubic with antialiasing: torch's own
  ``interpolate``, rounded back to uint8), the fused rescale and CLIP normalisation, and the
  processor's ``patchify`` row order (``[t * h * w, 3 * temporal * patch**2]``, the last frame
  repeated to fill a temporal patch);
* ``audio_track``: the video's first audio stream, mono float32 at 16 kHz (FFmpeg's resampler).

An unusable file raises ``VideoFileError`` whose ``reason`` names what is wrong: ``missing``,
``empty`` (0 bytes), ``undecodable`` (no container or video stream FFmpeg can read), ``truncated``
(decoding stops before the frames the stream declares), ``no frames``, ``too few frames`` (fewer
than a temporal patch), ``no audio track`` (asked for). ``probe_video`` decodes the audio track in the
same pass as the frames (its packets come interleaved with theirs), so a track that stops decoding
(``bad audio track``) or holds fewer packets than its stream declares (``truncated audio track``) is
known without another read (``VideoInfo.track_problem``). A video inside a shard
(``entrain.data.records.ImageRef``: a WebDataset member, Parquet / Arrow bytes) is decoded from its
bytes alike. ``entrain.data.video_records`` reads the
videos of a record (``check_record_video``: every bad video of one record, what ``data check`` reports).
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from entrain.data.records import ImageRef, media_file

__all__ = [
    "AUDIO_IN_VIDEO_FIELD",
    "VideoFileError",
    "VideoSettings",
    "VideoInfo",
    "probe_video",
    "sample_indices",
    "video_grid",
    "read_frames",
    "process_frames",
    "load_video",
    "file_grid",
    "sampled_fps",
    "audio_track",
    "qwen3_smart_resize",
]

AUDIO_IN_VIDEO_FIELD = "use_audio_in_video"

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class VideoFileError(ValueError):
    """A video file that cannot be used; ``reason`` says why, ``path`` names it."""

    def __init__(self, path: str, reason: str, detail: str = ""):
        self.path, self.reason, self.detail = str(path), reason, detail
        super().__init__(f"{path}: {reason}" + (f" ({detail})" if detail else ""))

    @property
    def problem(self) -> str:
        """The reason with its detail (what a report prints after the path)."""
        return self.reason + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class VideoSettings:
    """The video processor's numbers (defaults: transformers' ``Qwen2VLVideoProcessor`` as the
    Qwen2.5-Omni processor calls it, sampling at 2 fps)."""

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    temporal_patch_size: int = 2
    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 768 * 28 * 28
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    rescale_factor: float = 1 / 255
    sampler: str = "qwen2"
    """``qwen2``: ``Qwen2VLVideoProcessor``'s frame sampling and per-frame ``smart_resize``;
    ``qwen3``: ``Qwen3VLVideoProcessor``'s (``QWEN3_SETTINGS``: frames spread by ``linspace``, no
    temporal rounding; the pixel limits bound ``frames x height x width``)."""

    @property
    def second_per_grid(self) -> float:
        """Seconds of one temporal patch (``temporal_patch_size / fps``, the Omni processor's
        ``video_second_per_grid``)."""
        return self.temporal_patch_size / self.fps

    @classmethod
    def from_config(cls, config: dict, base: VideoSettings | None = None) -> VideoSettings:
        """From a video processor config dict (absent fields: the defaults; ``min_pixels`` /
        ``max_pixels`` before ``size``, as the processor takes them)."""
        size = config.get("size") or {}
        out = {
            "min_pixels": config.get("min_pixels", size.get("shortest_edge")),
            "max_pixels": config.get("max_pixels", size.get("longest_edge")),
            "image_mean": tuple(config["image_mean"]) if "image_mean" in config else None,
            "image_std": tuple(config["image_std"]) if "image_std" in config else None,
        }
        for key in ("fps", "min_frames", "max_frames", "temporal_patch_size", "patch_size", "merge_size",
                    "rescale_factor"):  # fmt: skip
            out[key] = config.get(key)
        return replace(base or cls(), **{k: v for k, v in out.items() if v is not None})

    @classmethod
    def from_folder(
        cls,
        folder: str | os.PathLike | None,
        *,
        image_config: bool = False,
        base: VideoSettings | None = None,
    ) -> VideoSettings:
        """A checkpoint folder's video processor config, found as transformers' ``AutoVideoProcessor``
        finds it: ``processor_config.json``'s ``video_processor``, ``video_preprocessor_config.json``,
        then (with ``image_config``) ``preprocessor_config.json``; ``base`` (the defaults) without one,
        and for the fields a config leaves out."""
        base = base or cls()
        if not folder:
            return base
        root = Path(folder)
        nested = root / "processor_config.json"
        if nested.is_file():
            config = json.loads(nested.read_text()).get("video_processor")
            if isinstance(config, dict):
                return cls.from_config(config, base)
        for name in (
            "video_preprocessor_config.json",
            *(("preprocessor_config.json",) if image_config else ()),
        ):
            if (root / name).is_file():
                return cls.from_config(json.loads((root / name).read_text()), base)
        return base


DEFAULT_SETTINGS = VideoSettings()
QWEN3_SETTINGS = VideoSettings(patch_size=16, min_pixels=128 * 32 * 32, max_pixels=768 * 32 * 32,
                               image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5), sampler="qwen3")  # fmt: skip
"""``Qwen3VLVideoProcessor``'s defaults."""


@dataclass(frozen=True)
class VideoInfo:
    """What decoding a video file shows: its frame count, frame rate and frame size, whether it holds
    an audio stream, and what is wrong with that audio track (``track_problem``: ``(reason, detail)``,
    None when it decodes whole)."""

    frames: int
    fps: float
    height: int
    width: int
    has_audio: bool
    track_problem: tuple[str, str] | None = None

    def track_error(self, path) -> VideoFileError | None:
        """The ``VideoFileError`` naming ``path`` for a bad audio track, None for a good one or none."""
        return None if self.track_problem is None else VideoFileError(str(path), *self.track_problem)


Source = str | ImageRef
"""A video file's path, or a video stored inside a shard (``entrain.data.records.ImageRef``)."""


def _source(path: str | os.PathLike | ImageRef) -> Source:
    return path if isinstance(path, ImageRef) else str(path)


def _open(src: Source):
    import av

    name = str(src)
    if isinstance(src, ImageRef):
        try:
            file = media_file(src)
        except OSError as e:
            raise VideoFileError(name, "undecodable", _short(e)) from None
        if not file.getbuffer().nbytes:
            raise VideoFileError(name, "empty", "0 bytes")
    else:
        if not os.path.isfile(src):
            raise VideoFileError(name, "missing")
        if os.path.getsize(src) == 0:
            raise VideoFileError(name, "empty", "0 bytes")
        file = src
    try:
        container = av.open(file)
    except (av.FFmpegError, UnicodeDecodeError, ValueError) as e:
        raise VideoFileError(name, "undecodable", _short(e)) from None
    if not container.streams.video:
        container.close()
        raise VideoFileError(name, "undecodable", "no video stream")
    return container


def _short(e: Exception) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


CONVERT_THREADS = 1
"""Threads of FFmpeg's pixel-format and audio-rate converters (``to_ndarray``, ``AudioResampler``). Left at
FFmpeg's choice (0: one per core), PyAV 18.1.1 keeps the converter's threads alive after the frames and
the container are gone (a cached converter; the audio filter graph until a garbage collection), and a
process forked after a decode (a DataLoader worker, a forked rank) can deadlock on a lock one of them
held. One thread converts the same pixels (``tests/data/test_video_threads.py``)."""

PROBED_IN_SHARDS = 1024
_probed: dict[tuple, VideoInfo] = {}
"""``probe_video`` of videos inside shards, by location and the shard's state (at most
``PROBED_IN_SHARDS``; the bytes are not kept)."""


def probe_video(path: str | os.PathLike | ImageRef) -> VideoInfo:
    """Decode every frame of a video file (so a truncated one shows), and its audio track's (so a
    truncated or corrupt track shows: ``VideoInfo.track_problem``); VideoFileError otherwise. The
    answer is remembered per file state (path, size, modification time; a video inside a shard: its
    location and the shard's state): the metadata pass, data check and the renderer each ask it."""
    src = _source(path)
    try:
        st = os.stat(src.shard if isinstance(src, ImageRef) else src)
    except OSError:
        raise VideoFileError(str(src), "missing") from None
    if not isinstance(src, ImageRef):
        return _probe(src, st.st_size, st.st_mtime_ns)
    key = (src.light(), st.st_size, st.st_mtime_ns)
    info = _probed.get(key)
    if info is None:
        info = _decode(src)
        if len(_probed) >= PROBED_IN_SHARDS:  # bounded: start again rather than grow
            _probed.clear()
        _probed[key] = info
    return info


@functools.lru_cache(maxsize=1024)
def _probe(path: str, size: int, mtime_ns: int) -> VideoInfo:
    return _decode(path)


class _Track:
    """The audio track's samples as ``_decode`` demuxes its packets beside the video's, and the first
    decoding error."""

    def __init__(self, stream):
        self.stream, self.samples, self.largest, self.error = stream, 0, 0, None

    def add(self, packet) -> None:
        import av

        if self.error is not None:
            return
        try:
            for frame in packet.decode():
                self.samples += frame.samples
                self.largest = max(self.largest, frame.samples)
        except av.FFmpegError as e:
            self.error = f"decoding stopped after {self.samples} sample(s): {_short(e)}"

    def problem(self) -> tuple[str, str] | None:
        """``(reason, detail)`` of a track that stops decoding, or whose samples fall short of its
        stream's duration by more than a frame (the stream ends early: a cut file), else None."""
        if self.error is not None:
            return "bad audio track", self.error
        if self.samples == 0:
            return "no audio track", "its audio stream holds no samples"
        rate = self.stream.codec_context.sample_rate or self.stream.rate or 0
        declared = float(self.stream.duration * self.stream.time_base) if self.stream.duration else 0.0
        if rate and (self.samples + self.largest) / rate < declared:
            return (
                "truncated audio track",
                f"{self.samples / rate:.2f} s of the {declared:.2f} s its stream declares",
            )
        return None


def _decode(src: Source) -> VideoInfo:
    import av

    with _open(src) as container:
        stream = container.streams.video[0]
        track = _Track(container.streams.audio[0]) if container.streams.audio else None
        declared = int(stream.frames or 0)
        fps = float(stream.average_rate or stream.guessed_rate or 0)
        count, size = 0, (0, 0)
        try:
            for packet in container.demux(stream, *([track.stream] if track else [])):
                if track is not None and packet.stream.index == track.stream.index:
                    track.add(packet)
                    continue
                for frame in packet.decode():
                    count += 1
                    size = (frame.height, frame.width)
        except av.FFmpegError as e:
            raise VideoFileError(
                str(src), "truncated", f"decoding stopped after {count} frame(s): {_short(e)}"
            ) from None
        audio_problem = track and track.problem()  # reads the stream: PyAV 18.1.1 refuses once it is closed
    if count == 0:
        raise VideoFileError(str(src), "no frames", f"its stream declares {declared}")
    if declared and count < declared:
        raise VideoFileError(str(src), "truncated", f"{count} of the {declared} frames its stream declares")
    if fps <= 0:
        raise VideoFileError(str(src), "undecodable", "no frame rate")
    return VideoInfo(count, fps, size[0], size[1], track is not None, audio_problem)


def sample_indices(total: int, video_fps: float, s: VideoSettings = DEFAULT_SETTINGS) -> list[int]:
    """Indices of the frames the processor keeps of a ``total``-frame ``video_fps`` video
    (``Qwen2VLVideoProcessor.sample_frames`` with ``fps``; ``Qwen3VLVideoProcessor``'s for the
    ``qwen3`` sampler). ValueError when none would be kept."""
    if s.sampler == "qwen3":
        n = min(max(int(total / video_fps * s.fps), s.min_frames), s.max_frames, total)
        if n < s.temporal_patch_size:
            raise ValueError(f"{total} frame(s): fewer than a temporal patch of {s.temporal_patch_size}")
        return np.linspace(0, total - 1, n).round().astype(int).tolist()
    tps = s.temporal_patch_size
    max_frames = math.floor(min(s.max_frames, total) / tps) * tps
    n = total / video_fps * s.fps
    n = min(max(n, s.min_frames), max_frames, total)
    n = math.floor(n / tps) * tps
    if n <= 0:
        raise ValueError(f"{total} frame(s): fewer than a temporal patch of {tps}")
    import torch

    return torch.arange(0, total, total / n).int().tolist()


def _smart_resize(height: int, width: int, s: VideoSettings) -> tuple[int, int]:
    """``smart_resize`` of the Qwen2-VL video processor (factor ``patch * merge``)."""
    factor = s.patch_size * s.merge_size
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio of a {width}x{height} video above 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > s.max_pixels:
        beta = math.sqrt((height * width) / s.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < s.min_pixels:
        beta = math.sqrt(s.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen3_smart_resize(
    frames: int, height: int, width: int, *, factor: int, temporal: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """``Qwen3VLVideoProcessor``'s ``smart_resize``: the frame size, multiples of ``factor`` (patch x
    merge), whose ``frames x height x width`` lies within the pixel limits, aspect ratio kept."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio of a {width}x{height} video above 200")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _smart_resize_qwen3(frames: int, height: int, width: int, s: VideoSettings) -> tuple[int, int]:
    return qwen3_smart_resize(
        frames, height, width, factor=s.patch_size * s.merge_size, temporal=s.temporal_patch_size,
        min_pixels=s.min_pixels, max_pixels=s.max_pixels,
    )  # fmt: skip


def video_grid(
    frames: int, height: int, width: int, s: VideoSettings = DEFAULT_SETTINGS
) -> tuple[int, int, int]:
    """``(t, h, w)`` patch grid of ``frames`` sampled frames of ``height x width``."""
    if s.sampler == "qwen3":
        rh, rw = _smart_resize_qwen3(frames, height, width, s)
    else:
        rh, rw = _smart_resize(height, width, s)
    return -(-frames // s.temporal_patch_size), rh // s.patch_size, rw // s.patch_size


def read_frames(path: str | os.PathLike | ImageRef, indices: Sequence[int]) -> np.ndarray:
    """``[n, H, W, 3]`` uint8 RGB frames at ``indices`` (ascending), decoded in order as transformers'
    ``pyav`` backend reads them."""
    path = _source(path)
    wanted, frames = set(int(i) for i in indices), {}
    last = max(wanted)
    with _open(path) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i > last:
                break
            if i in wanted:
                frames[i] = frame.to_ndarray(format="rgb24", threads=CONVERT_THREADS)
    missing = [i for i in indices if i not in frames]
    if missing:
        raise VideoFileError(path, "truncated", f"frame {missing[0]} could not be decoded")
    return np.stack([frames[int(i)] for i in indices])


def process_frames(
    frames: np.ndarray, s: VideoSettings = DEFAULT_SETTINGS
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """``(pixel_values [t*h*w, 3*temporal*patch**2] float32, (t, h, w))`` of ``[n, H, W, 3]`` uint8 frames."""
    import torch
    import torch.nn.functional as F

    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)  # [n, 3, H, W] uint8
    n, c, height, width = video.shape
    t, gh, gw = video_grid(n, height, width, s)
    rh, rw = gh * s.patch_size, gw * s.patch_size
    if (rh, rw) != (height, width):
        video = F.interpolate(
            video.float(), size=(rh, rw), mode="bicubic", align_corners=False, antialias=True
        )
        video = video.clamp_(0, 255).round_().to(torch.uint8)
    mean = torch.tensor(s.image_mean) * (1.0 / s.rescale_factor)
    std = torch.tensor(s.image_std) * (1.0 / s.rescale_factor)
    video = (video.to(torch.float32) - mean[:, None, None]) / std[:, None, None]
    if pad := -n % s.temporal_patch_size:
        video = torch.cat([video, video[-1:].expand(pad, -1, -1, -1)])
    m, p, tp = s.merge_size, s.patch_size, s.temporal_patch_size
    patches = video.reshape(t, tp, c, gh // m, m, p, gw // m, m, p)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return patches.reshape(t * gh * gw, c * tp * p * p).numpy(), (t, gh, gw)


def _sampled(path: Source, s: VideoSettings) -> tuple[VideoInfo, list[int]]:
    info = probe_video(path)
    try:
        return info, sample_indices(info.frames, info.fps, s)
    except ValueError as e:
        raise VideoFileError(path, "too few frames", str(e)) from None


def file_grid(
    path: str | os.PathLike | ImageRef, s: VideoSettings = DEFAULT_SETTINGS
) -> tuple[tuple[int, int, int], bool]:
    """``((t, h, w), has_audio)`` of a video file: its sampled frames' patch grid (the metadata pass)."""
    info, indices = _sampled(_source(path), s)
    try:
        return video_grid(len(indices), info.height, info.width, s), info.has_audio
    except ValueError as e:
        raise VideoFileError(path, "undecodable", str(e)) from None


def sampled_fps(path: str | os.PathLike | ImageRef, s: VideoSettings = DEFAULT_SETTINGS) -> float:
    """Frames kept per second of the video (transformers' ``VideoMetadata.sampled_fps``: kept / total
    x its frame rate), what Qwen2.5-VL's processor divides the temporal patch by."""
    info, indices = _sampled(_source(path), s)
    return len(indices) / info.frames * info.fps


def load_video(
    path: str | os.PathLike | ImageRef, s: VideoSettings = DEFAULT_SETTINGS
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """``(pixel_values, (t, h, w))`` of a video file: sampled, decoded and processed."""
    _, indices = _sampled(_source(path), s)
    return process_frames(read_frames(path, indices), s)


def audio_track(path: str | os.PathLike | ImageRef, rate: int = 16_000) -> np.ndarray:
    """The video's first audio stream as mono float32 samples at ``rate`` Hz (FFmpeg's resampler)."""
    import av

    path = _source(path)
    with _open(path) as container:
        if not container.streams.audio:
            raise VideoFileError(path, "no audio track", f"the record asks for it ({AUDIO_IN_VIDEO_FIELD})")
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate, threads=CONVERT_THREADS)
        parts = []
        try:
            for frame in container.decode(container.streams.audio[0]):
                parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
            parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
        except av.FFmpegError as e:
            raise VideoFileError(path, "truncated", f"audio track: {_short(e)}") from None
    samples = np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
    if samples.size == 0:
        raise VideoFileError(path, "no audio track", "its audio stream holds no samples")
    return samples


# --- records: placeholders, the text a video becomes, its metadata -----------------------------------


def track_frames(path: Source) -> int:
    """Mel frames of a video's audio track (``entrain.data.audio.mel_frames``)."""
    from entrain.data.audio import mel_frames

    return mel_frames(len(audio_track(path)))


def frame_seconds(indices: Sequence[int], fps: float, temporal_patch_size: int = 2) -> list[float]:
    """Seconds of each temporal patch of a video's kept frames ``indices`` (Qwen3-VL's timestamps: the
    mean of a patch's first and last frame times; the last frame repeated to fill the last patch)."""
    idx = list(indices)
    while idx and len(idx) % temporal_patch_size:
        idx.append(idx[-1])
    times = [i / fps for i in idx]
    return [
        (times[i] + times[i + temporal_patch_size - 1]) / 2 for i in range(0, len(times), temporal_patch_size)
    ]


def frames_of(
    path: str | os.PathLike | ImageRef, s: VideoSettings = DEFAULT_SETTINGS
) -> tuple[list[int], float]:
    """``(kept frame indices, the video's frame rate)`` of a video file."""
    info, indices = _sampled(_source(path), s)
    return indices, info.fps
