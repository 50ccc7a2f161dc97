"""What ``entrain profile`` times of InternVL: one-layer inputs of about ``tokens`` tokens.

The encoder's unit is a tile: an input of ``tokens`` tokens is ``max(1, round(tokens / P))`` tiles of
``P`` patches (each its own InternViT sequence with its CLS token), reported as ``tiles x P`` units.
The LLM's inputs are the composition's (one packed sample: ``tiled_model.llm_profile_input``).
"""

from __future__ import annotations

import torch

from entrain.models.families.tiled_model import llm_profile_input

__all__ = ["profile_input"]


def _encoder_input(cfg, layer: int, tokens: int, device: torch.device):
    v = cfg.shape.vision
    tiles = max(1, round(tokens / v.patches_per_tile))
    grid = torch.tensor([[tiles, cfg.shape.rules.side, cfg.shape.rules.side]], dtype=torch.int64)
    if layer == 0:
        x = torch.randn((tiles * v.patches_per_tile, v.patch_dim), device=device)
    else:
        x = torch.randn((tiles * v.tokens_per_tile, v.hidden_size), device=device, requires_grad=True)
    return (x, grid), tiles * v.patches_per_tile


def profile_input(cfg, component: str, layer: int, tokens: int, device: torch.device, per_label: bool):
    """``ModelFamily.profile_input``: the one-layer stage's forward args and units."""
    if component == "encoder":
        return _encoder_input(cfg, layer, tokens, device)
    return llm_profile_input(cfg, layer, tokens, device, per_label)
