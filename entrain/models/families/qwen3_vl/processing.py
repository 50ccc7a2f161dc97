"""Qwen3-VL's video rules (torch-free): what a sampled video becomes for the model.

* Prompt: a video of ``(t, h, w)`` patch grid becomes, per temporal patch (``temporal_patch_size``
  sampled frames), a timestamp text ``<{seconds:.1f} seconds>`` and the frame's ``<|vision_start|>`` +
  ``h * w / merge^2`` video placeholders + ``<|vision_end|>`` — what transformers' ``Qwen3VLProcessor``
  puts in place of the ``<|video_pad|>`` of its chat template's ``<|vision_start|><|video_pad|>
  <|vision_end|>``, so a conversation's ``<video>`` becomes those outer markers around it
  (``video_text``, ``expand_videos``). The timestamp of a temporal patch is the mean of its first and
  last frame's times (the last frame repeated to fill the final patch).
* Pixels: ``video_grid`` is the video processor's ``smart_resize`` (the pixel limits bound ``frames x
  height x width``); ``process_video`` resizes each frame (PIL bicubic; a frame already at the grid's
  size is left as it is, as transformers' processor leaves it), rescales and normalises it and cuts
  ``[t * h * w, 3 * temporal * patch^2]`` rows in ``Qwen3VLVideoProcessor.patchify``'s order. The vision
  tower takes them as an image of grid ``(t, h, w)`` (attention within each temporal patch).
* Positions: ``positions.sample_position_ids`` with ``video_positions`` (one grid row per frame
  there); ``positions.mrope_position_ids`` tells a video's tokens by the video token id."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "VIDEO_PLACEHOLDER",
    "VIDEO_TOKENS",
    "VideoSettings",
    "expand_videos",
    "frame_timestamps",
    "process_video",
    "video_grid",
    "video_placeholder_text",
    "video_text",
]

VIDEO_PLACEHOLDER = "<video>"
"""A video's placeholder in a LLaVA conversation (``entrain.data.records.PLACEHOLDERS``)."""

VIDEO_TOKENS = {"start": "<|vision_start|>", "video": "<|video_pad|>", "end": "<|vision_end|>"}


def frame_timestamps(frame_indices: Sequence[int], fps: float, temporal_patch_size: int = 2) -> list[float]:
    """Seconds of each temporal patch of the sampled ``frame_indices`` of a ``fps`` video."""
    indices = list(frame_indices)
    if not indices:
        return []
    while len(indices) % temporal_patch_size:
        indices.append(indices[-1])
    times = [i / fps for i in indices]
    return [
        (times[i] + times[i + temporal_patch_size - 1]) / 2 for i in range(0, len(times), temporal_patch_size)
    ]


def video_placeholder_text(grid: Sequence[int], frame_indices: Sequence[int], fps: float | None, *,
                           merge_size: int = 2, temporal_patch_size: int = 2, tokens: dict | None = None) -> str:  # fmt: skip
    """The prompt text one video of patch grid ``(t, h, w)`` stands for (``fps`` None: 24, as the
    processor assumes)."""
    t, h, w = (int(x) for x in grid)
    tok = {**VIDEO_TOKENS, **(tokens or {})}
    stamps = frame_timestamps(frame_indices, 24.0 if fps is None else fps, temporal_patch_size)
    if len(stamps) != t:
        raise ValueError(f"video grid {tuple(grid)}: {t} temporal patches but {len(stamps)} frame timestamps")
    frame = tok["start"] + tok["video"] * (h * w // merge_size**2) + tok["end"]
    return "".join(f"<{s:.1f} seconds>{frame}" for s in stamps)


def video_text(grid: Sequence[int], frame_indices: Sequence[int], fps: float | None, *, merge_size: int = 2,
               temporal_patch_size: int = 2, tokens: dict | None = None) -> str:  # fmt: skip
    """What a conversation's ``<video>`` becomes: the chat template's ``<|vision_start|>`` ...
    ``<|vision_end|>`` around ``video_placeholder_text`` (the processor expands the ``<|video_pad|>``
    between them)."""
    tok = {**VIDEO_TOKENS, **(tokens or {})}
    inner = video_placeholder_text(
        grid, frame_indices, fps, merge_size=merge_size, temporal_patch_size=temporal_patch_size, tokens=tok
    )
    return tok["start"] + inner + tok["end"]


def expand_videos(turns: Sequence[tuple[str, str]], texts: Sequence[str]) -> list[tuple[str, str]]:
    """``turns`` with their ``<video>`` placeholders replaced, in order, by ``texts`` (``video_text``);
    ValueError unless there is one text per placeholder."""
    n = sum(text.count(VIDEO_PLACEHOLDER) for _, text in turns)
    if n != len(texts):
        raise ValueError(f"{n} {VIDEO_PLACEHOLDER} placeholder(s) but {len(texts)} video(s)")
    out, k = [], 0
    for role, text in turns:
        parts = text.split(VIDEO_PLACEHOLDER)
        body = parts[0]
        for part in parts[1:]:
            body += texts[k] + part
            k += 1
        out.append((role, body))
    return out


class VideoSettings:
    """The video processor's numbers (``video_preprocessor_config.json``; defaults: transformers'
    ``Qwen3VLVideoProcessor``): pixel limits ``min_pixels`` / ``max_pixels`` (its ``size``
    ``shortest_edge`` / ``longest_edge``, bounding frames x height x width), geometry, and the
    normalisation."""

    def __init__(self, *, min_pixels: int = 128 * 32 * 32, max_pixels: int = 768 * 32 * 32, patch_size: int = 16,
                 merge_size: int = 2, temporal_patch_size: int = 2, image_mean=(0.5, 0.5, 0.5),
                 image_std=(0.5, 0.5, 0.5), rescale_factor: float = 1 / 255):  # fmt: skip
        self.min_pixels, self.max_pixels = int(min_pixels), int(max_pixels)
        self.patch_size, self.merge_size, self.temporal_patch_size = (
            patch_size,
            merge_size,
            temporal_patch_size,
        )
        self.image_mean, self.image_std = tuple(image_mean), tuple(image_std)
        self.rescale_factor = rescale_factor

    @classmethod
    def from_config(cls, config: dict) -> VideoSettings:
        """From a ``video_preprocessor_config.json`` dict (absent fields: the processor's defaults)."""
        size = config.get("size") or {}
        keys = (
            "patch_size",
            "merge_size",
            "temporal_patch_size",
            "image_mean",
            "image_std",
            "rescale_factor",
        )
        kwargs = {k: config[k] for k in keys if k in config}
        if "shortest_edge" in size:
            kwargs["min_pixels"] = size["shortest_edge"]
        if "longest_edge" in size:
            kwargs["max_pixels"] = size["longest_edge"]
        return cls(**kwargs)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


def _smart_resize(frames: int, height: int, width: int, s: VideoSettings) -> tuple[int, int]:
    """``Qwen3VLVideoProcessor``'s ``smart_resize`` (``entrain.data.video.qwen3_smart_resize``) under
    ``s``; a video needs at least one temporal patch of frames."""
    from entrain.data.video import qwen3_smart_resize

    temporal = s.temporal_patch_size
    if frames < temporal:
        raise ValueError(f"{frames} frame(s): a video needs at least temporal_patch_size {temporal}")
    return qwen3_smart_resize(
        frames,
        height,
        width,
        factor=s.factor,
        temporal=temporal,
        min_pixels=s.min_pixels,
        max_pixels=s.max_pixels,
    )


def video_grid(
    frames: int, height: int, width: int, settings: VideoSettings | None = None
) -> tuple[int, int, int]:
    """The ``(t, h, w)`` patch grid of ``frames`` sampled frames of ``height x width`` pixels."""
    s = settings or VideoSettings()
    h, w = _smart_resize(frames, height, width, s)
    t = -(-frames // s.temporal_patch_size)
    return t, h // s.patch_size, w // s.patch_size


def process_video(
    frames: Sequence, settings: VideoSettings | None = None
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """``(pixel_values [t * h * w, 3 * temporal * patch^2] float32, (t, h, w))`` of the sampled
    ``frames`` (RGB8 PIL images or ``[H, W, 3]`` uint8 arrays, all one size)."""
    from PIL import Image

    s = settings or VideoSettings()
    pics = [f if isinstance(f, Image.Image) else Image.fromarray(np.asarray(f, np.uint8)) for f in frames]
    if len({p.size for p in pics}) > 1:
        raise ValueError(f"the frames of a video differ in size: {sorted({p.size for p in pics})}")
    width, height = pics[0].size
    t, gh, gw = video_grid(len(pics), height, width, s)
    size = (gw * s.patch_size, gh * s.patch_size)
    arr = np.stack([np.asarray(p.convert("RGB") if p.size == size else p.convert("RGB").resize(size, Image.BICUBIC))
                    for p in pics]).astype(np.float32)  # fmt: skip
    arr = (arr * np.float32(s.rescale_factor) - np.asarray(s.image_mean, np.float32)) / np.asarray(
        s.image_std, np.float32
    )
    video = arr.transpose(0, 3, 1, 2)  # [frames, C, H, W]
    pad = -len(video) % s.temporal_patch_size
    if pad:
        video = np.concatenate([video, np.repeat(video[-1:], pad, axis=0)])
    m, p, c = s.merge_size, s.patch_size, video.shape[1]
    patches = video.reshape(t, s.temporal_patch_size, c, gh // m, m, p, gw // m, m, p)
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(patches.reshape(t * gh * gw, c * s.temporal_patch_size * p * p)), (t, gh, gw)
