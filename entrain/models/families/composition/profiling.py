"""What ``entrain profile`` times of the composition: a reduced model with one vision block per
attention kind and one decoder layer, and one-layer inputs of a given size."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from entrain.core.workload.samples import LABEL_FRACTION
from entrain.models.batch import LLMBatch
from entrain.models.families.composition.config import VLMConfig

__all__ = ["image_grid", "representative_config", "profile_input"]


def image_grid(num_patches: int, merge: int = 2) -> tuple[int, int, int]:
    """A still image ``(1, h, w)`` of about ``num_patches`` patches, ``h`` and ``w`` multiples of ``merge``."""
    side = max(merge, int(round(math.sqrt(num_patches) / merge)) * merge)
    w = max(merge, int(round(num_patches / side / merge)) * merge)
    return (1, side, w)


def representative_config(cfg: VLMConfig) -> tuple[VLMConfig, dict[str, dict[int, int]]]:
    """A model with one vision block per attention kind (window, full) and one decoder layer, and per
    component the map from each layer of ``cfg``'s lists to the layer of the small model measured
    for it (same kind)."""
    vis = cfg.vision
    kinds = [vis.is_full_attention(i) for i in range(vis.depth)]
    order = list(dict.fromkeys(kinds))  # kinds in order of first appearance
    small_vis = replace(
        vis, depth=len(order), fullatt_block_indexes=tuple(i for i, full in enumerate(order) if full)
    )
    small_llm = replace(cfg.llm, num_hidden_layers=1)
    small = replace(cfg, arch=replace(cfg.arch, vision=small_vis, llm=small_llm))
    d = vis.depth
    enc = {0: 0, d + 1: len(order) + 1}
    enc.update({i + 1: order.index(kinds[i]) + 1 for i in range(d)})
    n = cfg.llm.num_hidden_layers
    llm = {0: 0, n + 1: 2, n + 2: 3, n + 3: 4}
    llm.update({i + 1: 1 for i in range(n)})
    return small, {"encoder": enc, "llm": llm}


def _encoder_input(cfg: VLMConfig, layer: int, x: int, device: torch.device, per_label: bool = False):
    grid_t = image_grid(x, cfg.vision.spatial_merge_size)
    grid = torch.tensor([grid_t], dtype=torch.int64, device=device)
    n = grid_t[1] * grid_t[2]
    width = cfg.vision.patch_dim if layer == 0 else cfg.vision.hidden_size
    inp = torch.randn((n, width), device=device, requires_grad=layer > 0)
    return (inp, grid), n


def llm_input(cfg: VLMConfig, layer: int, x: int, device: torch.device, per_label: bool = False):
    num_labels = x if per_label else max(1, round(LABEL_FRACTION * x))
    ids = torch.randint(0, cfg.llm.vocab_size, (x,), device=device)
    label_pos = torch.arange(x - num_labels, x, device=device)
    batch = LLMBatch(
        input_ids=ids,
        position_ids=torch.arange(x, device=device),
        seq_lens=(x,),
        image_positions=torch.zeros(0, dtype=torch.int64, device=device),
        label_positions=label_pos,
        targets=ids[label_pos],
        loss_scale=1.0 / num_labels,
    )
    name = cfg.llm_layer_names[layer]
    h = cfg.llm.hidden_size
    if name == "embed_tokens":
        inp = None
    elif name == "loss":
        inp = torch.randn((num_labels, cfg.llm.vocab_size), device=device, requires_grad=True)
    else:
        inp = torch.randn((1, x, h), device=device, requires_grad=True)
    return (inp, batch), x


def profile_input(
    cfg: VLMConfig, component: str, layer: int, tokens: int, device: torch.device, per_label: bool
):
    """``ModelFamily.profile_input``: the one-layer stage's forward args and units."""
    make = _encoder_input if component == "encoder" else llm_input
    return make(cfg, layer, tokens, device, per_label)
