"""Activation recomputation as planned (``StageSpec.recompute``; ``costmodel.RECOMPUTE_MODES``).

``apply_recompute(stage, mode)`` wraps the forward of the stage's planned layers in
``torch.utils.checkpoint`` (non-reentrant), so their backward re-runs the forward instead of keeping
its activations:

* ``full``: every layer of the stage except a component's first (patch embedding, token embedding,
  which keep their activations, as the cost model prices them): ViT blocks, the merger, decoder
  layers, the final norm and the LM head; each keeps only its input.
* ``selective``: the attention sub-block of every transformer layer (``attn`` of a ViT block,
  ``self_attn`` of a decoder layer); the layer keeps the sub-block's input, not its Q, K, V and output.

The wrap is local to this process's module instances (each rank builds its own model).
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from entrain.core.costmodel import RECOMPUTE_MODES
from entrain.core.errors import ConfigError
from entrain.models.vlm import EncoderStage, LLMStage

__all__ = ["apply_recompute", "recomputed_modules"]


def recomputed_modules(stage: EncoderStage | LLMStage, mode: str) -> list[nn.Module]:
    """The modules whose forward ``mode`` recomputes on this stage."""
    if mode not in RECOMPUTE_MODES:
        raise ConfigError(f"recompute {mode!r}; choose from {', '.join(RECOMPUTE_MODES)}")
    if mode == "none":
        return []
    if isinstance(stage, EncoderStage):
        blocks = [stage.vis.blocks[i] for i in stage.block_ids]
        if mode == "selective":
            return [b.attn for b in blocks]
        return blocks + ([stage.vis.merger] if stage.has_merger else [])
    inner = stage.llm.model
    layers = [inner.layers[i] for i in stage.layer_ids]
    if mode == "selective":
        return [layer.self_attn for layer in layers]
    extra = ([inner.norm] if stage.has_norm else []) + ([stage.llm.lm_head] if stage.has_lm_head else [])
    return layers + extra


def _checkpointed(forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    run.entrain_recompute = True
    return run


def apply_recompute(stage: EncoderStage | LLMStage, mode: str) -> int:
    """Wrap the forward of ``stage``'s planned layers; returns how many modules were wrapped."""
    mods = recomputed_modules(stage, mode)
    for m in mods:
        if not getattr(m.forward, "entrain_recompute", False):
            m.forward = _checkpointed(m.forward)
    return len(mods)
