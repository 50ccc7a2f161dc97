"""What ``entrain profile`` times of a whole Qwen2-VL / Qwen2.5-VL: a reduced model (one vision block
per attention kind, one decoder layer) and one-layer inputs of a given size."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from entrain.core.workload.samples import LABEL_FRACTION
from entrain.models.batch import LLMBatch

__all__ = ["representative_config", "profile_input", "text_batch"]


def _image_grid(num_patches: int, merge: int) -> tuple[int, int, int]:
    """A still image ``(1, h, w)`` of about ``num_patches`` patches (sides multiples of ``merge``)."""
    side = max(merge, int(round(math.sqrt(num_patches) / merge)) * merge)
    return (1, side, max(merge, int(round(num_patches / side / merge)) * merge))


def representative_config(cfg):
    """``(small_cfg, reps)``: ``ModelFamily.representative_config``."""
    vis = cfg.vision
    kinds = [vis.is_full_attention(i) for i in range(vis.depth)]
    order = list(dict.fromkeys(kinds))
    full = tuple(i for i, f in enumerate(order) if f)
    small_shape = replace(
        cfg.shape,
        vision=replace(vis, depth=len(order), fullatt_block_indexes=full),
        llm=replace(cfg.llm, num_hidden_layers=1),
    )
    small = replace(cfg, shape=small_shape, depths=(len(order), full, 1))
    d, n = vis.depth, cfg.llm.num_hidden_layers
    enc = {0: 0, d + 1: len(order) + 1, **{i + 1: order.index(kinds[i]) + 1 for i in range(d)}}
    llm = {0: 0, n + 1: 2, n + 2: 3, n + 3: 4, **{i + 1: 1 for i in range(n)}}
    return small, {"encoder": enc, "llm": llm}


def text_batch(x: int, vocab: int, per_label: bool, device: torch.device) -> LLMBatch:
    """A text-only sample of ``x`` tokens (its M-RoPE ids are ``0..x-1`` on all three rows)."""
    num_labels = x if per_label else max(1, round(LABEL_FRACTION * x))
    ids = torch.randint(0, vocab, (x,), device=device)
    label_pos = torch.arange(x - num_labels, x, device=device)
    return LLMBatch(
        input_ids=ids,
        position_ids=torch.arange(x, device=device).expand(3, -1),
        seq_lens=(x,),
        image_positions=torch.zeros(0, dtype=torch.int64, device=device),
        label_positions=label_pos,
        targets=ids[label_pos],
        loss_scale=1.0 / num_labels,
    )


def profile_input(cfg, component: str, layer: int, tokens: int, device: torch.device, per_label: bool):
    """``ModelFamily.profile_input``: the one-layer stage's forward args and its units."""
    if component == "encoder":
        grid = _image_grid(tokens, cfg.vision.spatial_merge_size)
        n = grid[1] * grid[2]
        width = cfg.vision.patch_dim if layer == 0 else cfg.vision.hidden_size
        x = torch.randn((n, width), device=device, requires_grad=layer > 0)
        return (x, torch.tensor([grid], dtype=torch.int64)), n
    batch = text_batch(tokens, cfg.llm.vocab_size, per_label, device)
    n = cfg.llm.num_hidden_layers
    if layer == 0:
        x = None
    elif layer == n + 3:  # the loss takes the label positions' logits
        x = torch.randn((batch.targets.numel(), cfg.llm.vocab_size), device=device, requires_grad=True)
    else:
        x = torch.randn((1, tokens, cfg.llm.hidden_size), device=device, requires_grad=True)
    return (x, batch), tokens
