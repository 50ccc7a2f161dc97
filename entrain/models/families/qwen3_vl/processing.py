"""Qwen3-VL's video prompt rule (torch-free): a video of ``(t, h, w)`` patch grid becomes, per temporal
patch (``temporal_patch_size`` sampled frames), a timestamp text ``<{seconds:.1f} seconds>`` and the
frame's ``<|vision_start|>`` + ``h * w / merge^2`` video placeholders + ``<|vision_end|>`` — what
transformers' ``Qwen3VLProcessor`` renders; the timestamp of a temporal patch is the mean of its first
and last frame's times (the last frame repeated to fill the final patch). The M-RoPE ids of such a
sample: ``positions.sample_position_ids`` with ``video_positions`` (one grid row per frame there)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["frame_timestamps", "video_placeholder_text", "VIDEO_TOKENS"]

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
