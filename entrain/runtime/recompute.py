"""Activation recomputation as planned (``StageSpec.recompute``; ``costmodel.RECOMPUTE_MODES``).

``apply_recompute(stage, mode)`` wraps the forward of the stage's planned layers in
``torch.utils.checkpoint`` (non-reentrant), so their backward re-runs the forward instead of keeping
its activations:

* ``full``: every layer of the stage except a component's first (patch embedding, token embedding,
  which keep their activations, as the cost model prices them); each keeps only its input.
* ``selective``: the attention sub-block of every transformer layer; the layer keeps the sub-block's
  input, not its Q, K, V and output.

Which modules those are is the model family's (``ModelFamily.recompute_modules``).

The wrap is local to this process's module instances (each rank builds its own model).
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from entrain.core.costs.costmodel import RECOMPUTE_MODES
from entrain.core.errors import ConfigError

__all__ = ["apply_recompute", "recomputed_modules"]


def recomputed_modules(stage: nn.Module, mode: str) -> list[nn.Module]:
    """The modules whose forward ``mode`` recomputes on this stage (its model family's
    ``recompute_modules``)."""
    from entrain.models.families.registry import family_of

    if mode not in RECOMPUTE_MODES:
        raise ConfigError(f"recompute {mode!r}; choose from {', '.join(RECOMPUTE_MODES)}")
    if mode == "none":
        return []
    return family_of(stage).recompute_modules(stage, mode)


def _checkpointed(forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    run.entrain_recompute = True
    return run


def apply_recompute(stage: nn.Module, mode: str) -> int:
    """Wrap the forward of ``stage``'s planned layers; returns how many modules were wrapped."""
    mods = recomputed_modules(stage, mode)
    for m in mods:
        if not getattr(m.forward, "entrain_recompute", False):
            m.forward = _checkpointed(m.forward)
    return len(mods)
