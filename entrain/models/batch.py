"""The packed LLM (sub-)microbatch every family's LLM stages take (torch only, no family)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LLMBatch"]


@dataclass
class LLMBatch:
    """A packed LLM (sub-)microbatch: samples concatenated along the sequence.

    ``input_ids [T]``; ``position_ids`` ``[T]`` (1-D, restarting at 0 per sample) or ``[3, T]``
    (M-RoPE), as the family's ``position_ids`` made them; ``seq_lens`` per sample;
    ``image_positions [M]`` the placeholder positions, in sample order (the image features fill them in
    the same order); ``label_positions [n]`` and ``targets [n]`` where the loss is taken (the target
    is the next token); ``loss_scale`` = 1 / label tokens of the global batch.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    seq_lens: tuple[int, ...]
    image_positions: torch.Tensor
    label_positions: torch.Tensor
    targets: torch.Tensor
    loss_scale: float
