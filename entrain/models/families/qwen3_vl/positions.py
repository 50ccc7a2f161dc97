"""Interleaved M-RoPE position ids of a packed Qwen3-VL LLM batch.

Each sample's ``[3, L]`` ids (temporal, height, width) are what transformers' own model computes for
that sample alone: ``Qwen3VLModel.get_rope_index`` once per sample (image placeholder tokens typed 1,
video ones 2; a video's grid split per frame, as the processor puts a timestamp before each frame),
so visual tokens take their merged grid positions and the text after one continues from its start
+ ``max(h, w) / merge``. Samples' ids are concatenated, restarting at 0 per sample. The interleaving
of the t/h/w frequencies is the rotary table's (transformers' ``Qwen3VLTextRotaryEmbedding``).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from entrain.core.errors import ConfigError

__all__ = ["mrope_position_ids", "sample_position_ids", "split_videos"]


def _owner(hf_config: Any) -> SimpleNamespace:
    """What ``get_rope_index`` reads of its model: the config and ``get_vision_position_ids`` (no state)."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    return SimpleNamespace(
        config=hf_config,
        get_vision_position_ids=lambda *a, **k: Qwen3VLModel.get_vision_position_ids(None, *a, **k),
    )


def _runs(positions: torch.Tensor, grids, merge: int, where: str) -> list[tuple[int, int]]:
    """``(first, end)`` token span of each image; ConfigError unless each is one contiguous run of
    exactly its merged tokens."""
    sizes = [t * h * w // merge**2 for t, h, w in grids]
    if sum(sizes) != positions.numel():
        raise ConfigError(
            f"{where}: {positions.numel()} image tokens but its grids {list(grids)} need {sum(sizes)}"
        )
    runs, start = [], 0
    for i, n in enumerate(sizes):
        run = positions[start : start + n]
        if not n or int(run[-1]) - int(run[0]) != n - 1:
            raise ConfigError(f"{where}: the tokens of image {i} are not one contiguous run")
        runs.append((int(run[0]), int(run[-1]) + 1))
        start += n
    return runs


def sample_position_ids(hf_config: Any, input_ids, image_positions, grids: Sequence[Sequence[int]],
                        where: str = "sample", video_positions=None, video_grids=()) -> torch.Tensor:  # fmt: skip
    """``[3, L]`` int64 ids of one sample as transformers' ``get_rope_index`` gives them: ``input_ids
    [L]``, the image placeholders ``image_positions`` with the images' ``(t, h, w)`` patch grids, and
    optionally the video placeholders ``video_positions`` (each frame's tokens one run) with
    ``video_grids``."""
    input_ids = torch.as_tensor(input_ids, dtype=torch.int64).cpu()
    merge = hf_config.vision_config.spatial_merge_size
    runs = _runs(torch.as_tensor(image_positions, dtype=torch.int64).cpu(), grids, merge, where)
    types = torch.zeros(input_ids.numel(), dtype=torch.int32)
    for a, b in runs:
        types[a:b] = 1
    video_starts = []
    if video_positions is not None and len(video_grids):
        video_positions = torch.as_tensor(video_positions, dtype=torch.int64).cpu()
        types[video_positions] = 2
        sizes = [t * h * w // merge**2 for t, h, w in video_grids]
        if sum(sizes) != video_positions.numel():
            raise ConfigError(
                f"{where}: {video_positions.numel()} video tokens but its grids {list(video_grids)} need {sum(sizes)}"
            )
        video_starts = [int(video_positions[sum(sizes[:i])]) for i in range(len(sizes))]
    # two images with no token between (transformers would take them for one): split there, the part
    # from the second on continuing after the first part's largest id, as the text after an image does
    cuts = [0, *(runs[i][0] for i in range(1, len(runs)) if runs[i][0] == runs[i - 1][1]), input_ids.numel()]
    parts, offset = [], 0
    for a, b in zip(cuts, cuts[1:]):
        inside = [g for (s, _), g in zip(runs, grids) if a <= s < b]
        videos = [g for s, g in zip(video_starts, video_grids) if a <= s < b]  # frames apart: never split
        part = _rope_index(hf_config, input_ids[a:b], types[a:b], inside, videos) + offset
        offset = int(part.max()) + 1 if part.numel() else offset
        parts.append(part)
    return torch.cat(parts, dim=1)


def _rope_index(
    hf_config: Any, input_ids: torch.Tensor, types: torch.Tensor, grids, video_grids
) -> torch.Tensor:
    """Transformers' ``get_rope_index`` of one token sequence (``types``: 0 text, 1 image, 2 video)."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    def grid_tensor(gs):
        return torch.tensor([list(g) for g in gs], dtype=torch.int64).reshape(-1, 3) if len(gs) else None

    ids, _ = Qwen3VLModel.get_rope_index(
        _owner(hf_config),
        input_ids.unsqueeze(0),
        mm_token_type_ids=types.unsqueeze(0),
        image_grid_thw=grid_tensor(grids),
        video_grid_thw=grid_tensor(video_grids),
    )
    return ids[:, 0]


def split_videos(hf_config: Any, input_ids, positions, grids, where: str = "sample") -> tuple:
    """``(image positions, image grids, video positions, video grids)`` of a sample whose visual items
    (``positions`` of all their tokens, items in order, with their ``grids``) are images or videos: an
    item whose first token is the config's ``video_token_id`` is a video."""
    input_ids = torch.as_tensor(input_ids, dtype=torch.int64).cpu()
    positions = torch.as_tensor(positions, dtype=torch.int64).cpu()
    merge = hf_config.vision_config.spatial_merge_size
    video_id = getattr(hf_config, "video_token_id", None)
    images, image_grids, videos, video_grids, start = [], [], [], [], 0
    for g in grids:
        n = int(g[0]) * int(g[1]) * int(g[2]) // merge**2
        rows = positions[start : start + n]
        start += n
        is_video = video_id is not None and rows.numel() and int(input_ids[rows[0]]) == int(video_id)
        (videos if is_video else images).append(rows)
        (video_grids if is_video else image_grids).append(tuple(int(x) for x in g))
    if start != positions.numel():
        raise ConfigError(
            f"{where}: {positions.numel()} visual tokens but its grids {list(grids)} need {start}"
        )

    def cat(xs):
        return torch.cat(xs) if xs else torch.zeros(0, dtype=torch.int64)

    return cat(images), image_grids, cat(videos) if videos else None, video_grids


def mrope_position_ids(hf_config: Any, samples: Sequence[Any]) -> torch.Tensor:
    """``[3, T]`` ids of a packed batch: each sample's ``sample_position_ids`` (its videos told from its
    images by ``split_videos``), concatenated."""
    parts = []
    for i, s in enumerate(samples):
        where = f"packed sample {i}"
        images, grids, videos, video_grids = split_videos(
            hf_config, s.input_ids, s.image_positions, s.grids, where
        )
        parts.append(sample_position_ids(hf_config, s.input_ids, images, grids, where, videos, video_grids))
    return torch.cat(parts, dim=1) if parts else torch.zeros((3, 0), dtype=torch.int64)
