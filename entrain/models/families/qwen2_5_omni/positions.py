"""Time-aligned M-RoPE position ids of a packed Qwen2.5-Omni thinker batch.

Each sample's ``[3, L]`` ids (temporal, height, width) are what transformers' own model computes for
that sample alone: ``Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_rope_index`` once per
sample, with its images' and videos' grids, its audio clips' mel lengths and its videos' seconds per
temporal patch. A video's temporal ids advance ``second_per_grid * position_id_per_seconds`` per
temporal patch; an audio clip's tokens take consecutive ids; a video with its audio track
(``<|vision_start|><|audio_start|>`` then video and audio tokens interleaved per
``seconds_per_chunk``) is laid out with ``use_audio_in_video``, which a sample gets when any of its
videos carries its audio. Samples' ids are concatenated, restarting at 0 per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from entrain.core.errors import ConfigError

__all__ = ["mrope_position_ids", "sample_position_ids", "uses_audio_in_video"]


def _model_class() -> type:
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniPreTrainedModelForConditionalGeneration,
    )

    return Qwen2_5OmniPreTrainedModelForConditionalGeneration


def _owner(hf_config: Any) -> SimpleNamespace:
    """What ``get_rope_index`` reads of its model: the config, the merge size and two helpers that use
    no state of the model, so no model has to be built to call it."""
    cls = _model_class()
    owner = SimpleNamespace(config=hf_config, spatial_merge_size=hf_config.vision_config.spatial_merge_size)
    owner.get_llm_pos_ids_for_vision = lambda *a, **k: cls.get_llm_pos_ids_for_vision(owner, *a, **k)
    owner.get_chunked_index = lambda *a, **k: cls.get_chunked_index(owner, *a, **k)
    return owner


def uses_audio_in_video(hf_config: Any, input_ids: torch.Tensor) -> bool:
    """True when a video of the sample carries its audio track (``<|vision_start|>`` followed by
    ``<|audio_start|>``, as the processor lays it out)."""
    ids = torch.as_tensor(input_ids, dtype=torch.int64)
    starts = (ids[:-1] == hf_config.vision_start_token_id).nonzero()[:, 0]
    return bool((ids[starts + 1] == hf_config.audio_start_token_id).any()) if starts.numel() else False


def _grid_tensor(grids) -> torch.Tensor | None:
    return torch.tensor([list(g) for g in grids], dtype=torch.int64).reshape(-1, 3) if len(grids) else None


def sample_position_ids(hf_config: Any, input_ids, *, image_grids=(), video_grids=(), audio_lengths=(),
                        second_per_grids=(), where: str = "sample") -> torch.Tensor:  # fmt: skip
    """``[3, L]`` int64 ids of one sample (``input_ids [L]``) as transformers' ``get_rope_index`` gives
    them: its images' and videos' ``(t, h, w)`` patch grids in order, its audio clips' mel frame
    counts (``audio_lengths``) and each video's seconds per temporal patch."""
    ids = torch.as_tensor(input_ids, dtype=torch.int64).cpu()
    merge = hf_config.vision_config.spatial_merge_size
    counts = {
        "image": (hf_config.image_token_id, sum(t * h * w // merge**2 for t, h, w in image_grids)),
        "video": (hf_config.video_token_id, sum(t * h * w // merge**2 for t, h, w in video_grids)),
        "audio": (hf_config.audio_token_id, sum(((n - 1) // 2 + 1 - 2) // 2 + 1 for n in audio_lengths)),
    }
    for kind, (token, want) in counts.items():
        got = int((ids == token).sum())
        if got != want:
            raise ConfigError(f"{where}: {got} {kind} tokens but its {kind} inputs need {want}")
    if len(second_per_grids) != len(video_grids):
        raise ConfigError(f"{where}: {len(video_grids)} videos but {len(second_per_grids)} seconds per grid")
    if not len(image_grids) and not len(video_grids):  # transformers: text (and audio) ids run 0..L-1
        return torch.arange(ids.numel(), dtype=torch.int64).expand(3, -1).clone()
    positions, _ = _model_class().get_rope_index(
        _owner(hf_config),
        ids.unsqueeze(0),
        _grid_tensor(image_grids),
        _grid_tensor(video_grids),
        torch.ones((1, ids.numel()), dtype=torch.int64),
        uses_audio_in_video(hf_config, ids),
        torch.tensor(list(audio_lengths), dtype=torch.int64) if len(audio_lengths) else None,
        torch.tensor(list(second_per_grids), dtype=torch.float64) if len(video_grids) else None,
    )
    return positions[:, 0]


def mrope_position_ids(hf_config: Any, samples: Sequence[Any]) -> torch.Tensor:
    """``[3, T]`` int64 ids of a packed batch: each sample's ``sample_position_ids``, concatenated.
    ``samples``: objects with ``input_ids`` and ``grids`` (images; ``PackedSample``), and optionally
    ``video_grids``, ``audio_lengths``, ``second_per_grids``."""
    parts = [
        sample_position_ids(
            hf_config,
            s.input_ids,
            image_grids=s.grids,
            video_grids=getattr(s, "video_grids", ()),
            audio_lengths=getattr(s, "audio_lengths", ()),
            second_per_grids=getattr(s, "second_per_grids", ()),
            where=f"packed sample {i}",
        )
        for i, s in enumerate(samples)
    ]
    return torch.cat(parts, dim=1) if parts else torch.zeros((3, 0), dtype=torch.int64)
