"""M-RoPE position ids of a packed Qwen2-VL / Qwen2.5-VL LLM batch.

Each sample's ``[3, L]`` ids (temporal, height, width) are what transformers' own model computes for
that sample alone: its ``get_rope_index`` is called once per sample (image placeholder tokens marked
as images, the sample's image grids), so image tokens take their merged ``(t, h, w)`` grid positions
and the text after an image continues from the image's largest position + 1. The samples' ids are
concatenated, so they restart at 0 per packed sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from entrain.core.errors import ConfigError

__all__ = ["mrope_position_ids", "sample_position_ids", "model_class"]


def model_class(model_type: str) -> type:
    """Transformers' ``Qwen2VLModel`` / ``Qwen2_5_VLModel`` (the class holding ``get_rope_index``)."""
    if model_type == "qwen2_vl":
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

        return Qwen2VLModel
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    return Qwen2_5_VLModel


def _rope_owner(hf_config: Any) -> SimpleNamespace:
    """What ``get_rope_index`` reads of its model: the config and ``get_vision_position_ids`` (which
    uses no state of the model), so no model has to be built to call it."""
    cls = model_class(hf_config.model_type)
    return SimpleNamespace(
        config=hf_config,
        get_vision_position_ids=lambda *a, **k: cls.get_vision_position_ids(None, *a, **k),
    )


def _image_runs(image_positions: torch.Tensor, grids, merge: int, where: str) -> list[tuple[int, int]]:
    """``(first, end)`` token span of each image; ConfigError unless the placeholders are one
    contiguous run per image of exactly its merged tokens."""
    sizes = [t * h * w // merge**2 for t, h, w in grids]
    if sum(sizes) != image_positions.numel():
        raise ConfigError(
            f"{where}: {image_positions.numel()} image tokens but its grids {list(grids)} need {sum(sizes)}"
        )
    runs, start = [], 0
    for i, n in enumerate(sizes):
        run = image_positions[start : start + n]
        if not n or int(run[-1]) - int(run[0]) != n - 1:
            raise ConfigError(f"{where}: the tokens of image {i} are not one contiguous run")
        runs.append((int(run[0]), int(run[-1]) + 1))
        start += n
    return runs


def _rope_index(
    hf_config: Any, input_ids: torch.Tensor, runs: list[tuple[int, int]], grids, videos=()
) -> torch.Tensor:
    """Transformers' ``get_rope_index`` of one token sequence whose images (``runs``) are apart;
    ``videos``: ``(first, end, grid, seconds per temporal patch)`` of its videos' runs."""
    types = torch.zeros((1, input_ids.numel()), dtype=torch.int32)
    for a, b in runs:
        types[0, a:b] = 1
    for a, b, _, _ in videos:
        types[0, a:b] = 2
    grid_thw = torch.tensor([list(g) for g in grids], dtype=torch.int64).reshape(-1, 3) if grids else None
    cls = model_class(hf_config.model_type)
    owner = _rope_owner(hf_config)
    extra = {}
    if videos:
        extra["video_grid_thw"] = torch.tensor([list(v[2]) for v in videos], dtype=torch.int64)
        if hf_config.model_type != "qwen2_vl":
            extra["second_per_grid_ts"] = torch.tensor([v[3] for v in videos], dtype=torch.float64)
    ids, _ = cls.get_rope_index(
        owner, input_ids.unsqueeze(0), mm_token_type_ids=types, image_grid_thw=grid_thw, **extra
    )
    return ids[:, 0]


def sample_position_ids(
    hf_config: Any,
    input_ids: torch.Tensor,
    image_positions: torch.Tensor,
    grids: Sequence[Sequence[int]],
    where: str = "sample",
    video_grids: Sequence[Sequence[int]] = (),
    second_per_grids: Sequence[float] = (),
) -> torch.Tensor:
    """``[3, L]`` int64 M-RoPE ids of one sample (``input_ids [L]``, placeholder ``image_positions``,
    its images' ``(t, h, w)`` patch grids) as transformers' ``get_rope_index`` gives them.

    Two images with no token between them (transformers would take them for one group; Qwen2-VL's
    processor always puts ``<|vision_end|><|vision_start|>`` between) are split there: the part from
    the second image on continues after the first part's largest id, as the text after an image does."""
    input_ids = torch.as_tensor(input_ids, dtype=torch.int64).cpu()
    image_positions = torch.as_tensor(image_positions, dtype=torch.int64).cpu()
    merge = hf_config.vision_config.spatial_merge_size
    videos: list[tuple[int, int, Any, float]] = []
    if len(video_grids):  # image_positions holds the videos' tokens too: told apart by the video id
        is_video = input_ids[image_positions] == int(hf_config.video_token_id)
        spans = _image_runs(image_positions[is_video], video_grids, merge, where)
        videos = [(a, b, g, t) for (a, b), g, t in zip(spans, video_grids, second_per_grids)]
        image_positions = image_positions[~is_video]
    runs = _image_runs(image_positions, grids, merge, where)
    every = sorted([*runs, *((a, b) for a, b, _, _ in videos)])
    cuts = [
        0,
        *(every[i][0] for i in range(1, len(every)) if every[i][0] == every[i - 1][1]),
        input_ids.numel(),
    ]
    parts, offset = [], 0
    for a, b in zip(cuts, cuts[1:]):
        inside = [i for i, (s, _) in enumerate(runs) if a <= s < b]
        local = [(runs[i][0] - a, runs[i][1] - a) for i in inside]
        vids = [(s - a, e - a, g, t) for s, e, g, t in videos if a <= s < b]
        part = _rope_index(hf_config, input_ids[a:b], local, [grids[i] for i in inside], vids) + offset
        offset = int(part.max()) + 1 if part.numel() else offset
        parts.append(part)
    return torch.cat(parts, dim=1)


def mrope_position_ids(hf_config: Any, samples: Sequence[Any]) -> torch.Tensor:
    """``[3, T]`` int64 ids of a packed batch: each sample's ``sample_position_ids`` (restarting at 0),
    concatenated in order. ``samples``: objects with ``input_ids``, ``image_positions`` and ``grids``
    (``entrain.models.families.base.PackedSample``)."""
    parts = [
        sample_position_ids(
            hf_config,
            s.input_ids,
            s.image_positions,
            s.grids,
            f"packed sample {i}",
            getattr(s, "video_grids", ()),
            getattr(s, "second_per_grids", ()),
        )  # fmt: skip
        for i, s in enumerate(samples)
    ]
    return torch.cat(parts, dim=1) if parts else torch.zeros((3, 0), dtype=torch.int64)
