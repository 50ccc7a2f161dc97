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


def _check_images(
    input_ids: torch.Tensor, image_positions: torch.Tensor, grids, merge: int, where: str
) -> None:
    """ConfigError unless the placeholders are one run per image of exactly its merged tokens, with a
    token between two images (what transformers' grouping of image tokens relies on)."""
    sizes = [t * h * w // merge**2 for t, h, w in grids]
    if sum(sizes) != image_positions.numel():
        raise ConfigError(
            f"{where}: {image_positions.numel()} image tokens but its grids {list(grids)} need {sum(sizes)}"
        )
    start = 0
    for i, n in enumerate(sizes):
        run = image_positions[start : start + n]
        if n and int(run[-1]) - int(run[0]) != n - 1:
            raise ConfigError(f"{where}: the tokens of image {i} are not contiguous")
        if i and n and int(run[0]) == int(image_positions[start - 1]) + 1:
            raise ConfigError(
                f"{where}: images {i - 1} and {i} touch; Qwen2-VL separates images by "
                "<|vision_end|><|vision_start|> tokens"
            )
        start += n


def sample_position_ids(
    hf_config: Any,
    input_ids: torch.Tensor,
    image_positions: torch.Tensor,
    grids: Sequence[Sequence[int]],
    where: str = "sample",
) -> torch.Tensor:
    """``[3, L]`` int64 M-RoPE ids of one sample (``input_ids [L]``, placeholder ``image_positions``,
    its images' ``(t, h, w)`` patch grids) as transformers' ``get_rope_index`` gives them."""
    input_ids = torch.as_tensor(input_ids, dtype=torch.int64).cpu()
    image_positions = torch.as_tensor(image_positions, dtype=torch.int64).cpu()
    _check_images(input_ids, image_positions, grids, hf_config.vision_config.spatial_merge_size, where)
    types = torch.zeros((1, input_ids.numel()), dtype=torch.int32)
    types[0, image_positions] = 1
    grid_thw = torch.tensor([list(g) for g in grids], dtype=torch.int64).reshape(-1, 3) if grids else None
    owner = _rope_owner(hf_config)
    cls = model_class(hf_config.model_type)
    ids, _ = cls.get_rope_index(
        owner, input_ids.unsqueeze(0), mm_token_type_ids=types, image_grid_thw=grid_thw
    )
    return ids[:, 0]


def mrope_position_ids(hf_config: Any, samples: Sequence[Any]) -> torch.Tensor:
    """``[3, T]`` int64 ids of a packed batch: each sample's ``sample_position_ids`` (restarting at 0),
    concatenated in order. ``samples``: objects with ``input_ids``, ``image_positions`` and ``grids``
    (``entrain.models.families.base.PackedSample``)."""
    parts = [
        sample_position_ids(hf_config, s.input_ids, s.image_positions, s.grids, f"packed sample {i}")
        for i, s in enumerate(samples)
    ]
    return torch.cat(parts, dim=1) if parts else torch.zeros((3, 0), dtype=torch.int64)
