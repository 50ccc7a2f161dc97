"""What ``entrain profile`` times of LLaVA-OneVision: one-layer inputs of about ``tokens`` tokens.

The encoder's unit is a tile: an input of ``tokens`` tokens is ``max(1, round(tokens / 729))`` tiles
(each its own SigLIP sequence), reported as ``tiles x 729`` units; the merger gets them as that
many single-tile images. The LLM's inputs are the composition's (one packed sample: ``tiled_model.llm_profile_input``).
"""

from __future__ import annotations

import torch

from entrain.models.families.llava_onevision.model import TileBatch
from entrain.models.families.tiled_model import llm_profile_input

__all__ = ["profile_input"]


def _encoder_input(cfg, layer: int, tokens: int, device: torch.device):
    v = cfg.shape.vision
    per_tile = v.tokens_per_tile
    tiles = max(1, round(tokens / per_tile))
    images = TileBatch(
        pixel_values=torch.randn((tiles, v.num_channels, v.image_size, v.image_size), device=device),
        image_sizes=torch.full((tiles, 2), v.image_size, dtype=torch.int64),
        tiles_per_image=(1,) * tiles,
    )
    if layer == 0:
        x = images.pixel_values
    else:
        x = torch.randn((tiles * per_tile, v.hidden_size), device=device, requires_grad=True)
    return (x, images), tiles * per_tile


def profile_input(cfg, component: str, layer: int, tokens: int, device: torch.device, per_label: bool):
    """``ModelFamily.profile_input``: the one-layer stage's forward args and units."""
    if component == "encoder":
        return _encoder_input(cfg, layer, tokens, device)
    return llm_profile_input(cfg, layer, tokens, device, per_label)
