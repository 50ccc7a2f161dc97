"""A video in a LLaVA-format record: its paths (``video_paths``), every bad video of the record (``check_record_video``: what ``data check`` reports), the text each ``<video>`` placeholder becomes (``video_text``, Qwen2.5-Omni's interleaved audio chunks ``chunk_runs``) and a record's videos and turns as the model families count them. Decoding and the processor's frame rules are ``entrain.data.video``'s."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from entrain.data.records import ImageRef
from entrain.data.video import (
    AUDIO_IN_VIDEO_FIELD,
    DEFAULT_SETTINGS,
    VideoFileError,
    VideoSettings,
    file_grid,
    frame_seconds,
    frames_of,
    probe_video,
    track_frames,
)

__all__ = [
    "VIDEO_PLACEHOLDER",
    "video_paths",
    "check_record_video",
    "used_track",
    "VIDEO_MARKERS",
    "video_markers",
    "chunk_runs",
    "video_text",
    "placeholder_kinds",
    "expand_videos",
    "audio_slots",
    "record_videos",
    "counted_turns",
]


VIDEO_PLACEHOLDER = "<video>"


"""A record's flag (``true``): each of its videos brings its audio track (Qwen2.5-Omni)."""


def video_paths(record: dict) -> list[str | ImageRef]:
    """The record's ``video`` (or ``videos``) field as a list of paths, a shard's reader's videos
    (``ImageRef``) among them."""
    key = "video" if "video" in record else "videos"
    value = record.get(key)
    if value is None:
        return []
    if isinstance(value, (str, ImageRef)):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, ImageRef)) for v in value):
        return list(value)
    raise ValueError(f"{key!r} must be a path or a list of paths, not {type(value).__name__}")


def check_record_video(
    record: dict, root: str | os.PathLike, s: VideoSettings = DEFAULT_SETTINGS
) -> list[tuple[str, str]]:
    """``(field, problem)`` of every bad video file of ``record`` (paths relative to ``root``; the field
    ``video[i]`` of a list, ``video`` of one path; the problem names the file and what is wrong with
    it), a video without an audio track, or with a truncated or corrupt one, when the record asks for
    its audio (``used_track``), and a ``use_audio_in_video`` that is not a boolean; empty when all is
    well."""
    key = "video" if "video" in record else "videos"
    try:
        paths = video_paths(record)
    except ValueError as e:
        return [(key, str(e))]
    flag = record.get(AUDIO_IN_VIDEO_FIELD, False)
    problems = []
    if not isinstance(flag, bool):
        problems.append((AUDIO_IN_VIDEO_FIELD, f"must be true or false, not {flag!r}"))
    listed = isinstance(record.get(key), (list, tuple))
    for i, p in enumerate(paths):
        try:
            src = p if isinstance(p, ImageRef) else Path(root) / p
            file_grid(src, s)
            if flag is True:
                used_track(src, p)
        except VideoFileError as e:
            problems.append((f"{key}[{i}]" if listed else key, f"{p}: {e.problem}"))
    return problems


def used_track(src, name=None) -> None:
    """VideoFileError (naming ``name``, default ``src``) unless the video ``src`` holds an audio track
    that decodes whole (``VideoInfo.track_problem``), for a record that asks for it."""
    info = probe_video(src)
    name = src if name is None else name
    if not info.has_audio:
        raise VideoFileError(str(name), "no audio track", f"the record asks for it ({AUDIO_IN_VIDEO_FIELD})")
    error = info.track_error(name)
    if error is not None:
        raise error


VIDEO_MARKERS = {
    "omni": ("<|vision_bos|>", "<|VIDEO|>", "<|vision_eos|>"),
    "qwen2": ("<|vision_start|>", "<|video_pad|>", "<|vision_end|>"),
}
"""A video's start, placeholder and end tokens: Qwen2.5-Omni's tokenizer's names, or Qwen2's names of
the same ids (151652, 151656, 151653)."""


def video_markers(tokenizer) -> tuple[str, str, str]:
    """``VIDEO_MARKERS`` of the tokenizer's names."""
    return VIDEO_MARKERS["omni" if "<|VIDEO|>" in getattr(tokenizer, "special_tokens", {}) else "qwen2"]


def chunk_runs(
    grid: Sequence[int], audio_tokens: int, *, merge: int, second_per_grid: float,
    position_id_per_seconds: float = 25, seconds_per_chunk: float = 2.0,
) -> list[tuple[int, int]]:  # fmt: skip
    """``(video tokens, audio tokens)`` per time chunk of a video with its audio track, as the
    Qwen2.5-Omni processor interleaves them (``replace_video_with_audio_token``: a video token's time
    is its temporal patch x ``second_per_grid`` x ``position_id_per_seconds``, an audio token's its
    index; chunks of ``position_id_per_seconds * seconds_per_chunk``)."""
    t, h, w = grid
    per_frame = (h // merge) * (w // merge)
    video = np.repeat(np.arange(t), per_frame) * second_per_grid * position_id_per_seconds
    size = int(position_id_per_seconds * seconds_per_chunk)

    def chunks(indices) -> list[int]:
        out, start, current = [], 0, 1
        for i, value in enumerate(indices):
            if value >= current * size:
                out.append(i - start)
                start, current = i, current + 1
        return out + [len(indices) - start]

    v, a = chunks(video), chunks(np.arange(audio_tokens))
    return [(v[j] if j < len(v) else 0, a[j] if j < len(a) else 0) for j in range(max(len(v), len(a)))]


def video_text(tokenizer, grid: Sequence[int] | None, *, merge: int = 2, audio_tokens: int | None = None,
               second_per_grid: float = 1.0, position_id_per_seconds: float = 25,
               seconds_per_chunk: float = 2.0) -> str:  # fmt: skip
    """What a conversation's ``<video>`` becomes: ``<|vision_bos|>`` + the video's ``t*h*w/merge**2``
    ``<|VIDEO|>`` + ``<|vision_eos|>``; with its audio track (``audio_tokens``) the video and audio
    tokens interleaved per chunk between ``<|audio_bos|>`` and ``<|audio_eos|>`` inside them
    (``chunk_runs``). ``grid`` None: the markers alone (the metadata pass's text count)."""
    from entrain.data.processing import AUDIO_MARKERS

    start, pad, end = video_markers(tokenizer)
    if audio_tokens is None:
        n = 0 if grid is None else grid[0] * grid[1] * grid[2] // merge**2
        return start + pad * n + end
    bos, apad, eos = AUDIO_MARKERS[
        "omni" if "<|AUDIO|>" in getattr(tokenizer, "special_tokens", {}) else "qwen2"
    ]
    runs = [] if grid is None else chunk_runs(grid, audio_tokens, merge=merge, second_per_grid=second_per_grid,
                                              position_id_per_seconds=position_id_per_seconds,
                                              seconds_per_chunk=seconds_per_chunk)  # fmt: skip
    return start + bos + "".join(pad * v + apad * a for v, a in runs) + eos + end


def placeholder_kinds(turns: Sequence[tuple[str, str]]) -> list[str]:
    """The kinds (``image``, ``audio``, ``video``) of a conversation's placeholders, in order."""
    import re

    return [m.group(1) for _, text in turns for m in re.finditer(r"<(image|audio|video)>", text)]


def expand_videos(turns: Sequence[tuple[str, str]], texts: Sequence[str]) -> list[tuple[str, str]]:
    """``turns`` with their ``<video>`` placeholders replaced, in order, by ``texts``."""
    out, k = [], 0
    for role, text in turns:
        parts = text.split(VIDEO_PLACEHOLDER)
        body = parts[0]
        for part in parts[1:]:
            body += texts[k] + part
            k += 1
        out.append((role, body))
    if k != len(texts):
        raise ValueError(f"{k} {VIDEO_PLACEHOLDER} placeholder(s) but {len(texts)} video(s)")
    return out


def audio_slots(record) -> list[tuple[str, int]]:
    """The record's audio inputs in the order their tokens come: ``("audio", j)`` for its j-th clip,
    ``("video", i)`` for the audio track of its i-th video (with ``audio_in_video``)."""
    out, clip, video = [], 0, 0
    for kind in placeholder_kinds(record.turns):
        if kind == "audio":
            out.append(("audio", clip))
            clip += 1
        elif kind == "video":
            if record.audio_in_video:
                out.append(("video", video))
            video += 1
    return out


def record_videos(record, clip_frames: Sequence[int], stamps=None, s: VideoSettings = DEFAULT_SETTINGS):
    """``(video grids, audio frames)`` of ``record``: each video's patch grid, and the mel frames of its
    audio inputs in token order (``audio_slots``: its clips' ``clip_frames`` and, with
    ``audio_in_video``, its videos' tracks); ``stamps`` receives each video file's stamp. Raises
    DataError naming the record, field and file of a bad video (with ``audio_in_video``: of a bad
    audio track too, ``used_track``)."""
    from entrain.core.errors import DataError
    from entrain.data.metadata_cache import file_stamp

    grids = []
    where = record.line or f"#{record.index}"
    for i, path in enumerate(record.video):
        if stamps is not None and isinstance(path, str):  # a video inside a shard: the shard's stamp
            stamps[path] = file_stamp(path)
        try:
            grid, _ = file_grid(path, s)
            if record.audio_in_video:
                used_track(path)
        except VideoFileError as e:
            raise DataError(
                record.file, where, f"{record.video_field}[{i}]", f"{path}: {e.problem}"
            ) from None
        grids.append(grid)
    if not record.audio_in_video:
        return tuple(grids), tuple(clip_frames)
    frames = []
    for kind, k in audio_slots(record):
        if kind == "audio":
            frames.append(clip_frames[k])
            continue
        try:
            frames.append(track_frames(record.video[k]))
        except VideoFileError as e:
            raise DataError(
                record.file, where, f"{record.video_field}[{k}]", f"{record.video[k]}: {e.problem}"
            ) from None
    return tuple(grids), tuple(frames)


def counted_turns(record, tokenizer, s: VideoSettings = DEFAULT_SETTINGS) -> list[tuple[str, str]]:
    """The record's turns with each ``<video>`` as its markers alone (``video_text`` of no grid; for the
    ``qwen3`` sampler the timestamp and markers of each temporal patch too), so the text count holds
    every token but the video (and track) placeholders."""
    if not record.video:
        return list(record.turns)
    if s.sampler == "qwen3":
        start, _, end = video_markers(tokenizer)
        texts = []
        for path in record.video:
            indices, fps = frames_of(path, s)
            stamps = frame_seconds(indices, fps, s.temporal_patch_size)
            texts.append(start + "".join(f"<{t:.1f} seconds>{start}{end}" for t in stamps) + end)
        return expand_videos(record.turns, texts)
    text = video_text(tokenizer, None, audio_tokens=0 if record.audio_in_video else None)
    return expand_videos(record.turns, [text] * len(record.video))
