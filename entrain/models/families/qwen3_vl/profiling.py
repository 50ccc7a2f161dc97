"""What ``entrain profile`` times of a whole Qwen3-VL / Qwen3-VL-MoE checkpoint: a reduced model (one
vision block per block kind: untapped and DeepStack-tapped; one decoder layer per layer kind: dense and,
with experts, sparse) built from the checkpoint's own config with fewer layers, and one-layer inputs of
a given size (text-only LLM samples, as every family's profile).

The reduced model is the run's config with ``reduced`` set (``Qwen3VLConfig.hf`` applies it to
transformers' config of the folder); the profiler builds it on the meta device and gives it random
weights (``entrain.runtime.profiler.timing_model``): no checkpoint tensor is read.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch

from entrain.models.families.composition.profiling import image_grid
from entrain.models.families.qwen2_vl.profiling import text_batch

__all__ = ["Reduced", "representative_config", "reduce_hf", "profile_input"]

Reduced = tuple[tuple[int, ...], tuple[int, ...]]
"""``(vision blocks kept, decoder layers kept)``: indexes of the checkpoint's blocks / layers the reduced
model holds, in order (each the first of its kind)."""


def _sparse(cfg) -> tuple[int, ...]:
    return tuple(getattr(cfg.shape, "sparse", ()))


def _kinds(cfg) -> tuple[list[bool], list[bool]]:
    """Per vision block: tapped (runs a DeepStack merger); per decoder layer: sparse (experts)."""
    taps, sparse = set(cfg.shape.deepstack), set(_sparse(cfg))
    return [i in taps for i in range(cfg.vision.depth)], [
        i in sparse for i in range(cfg.llm.num_hidden_layers)
    ]


def representative_config(cfg):
    """``(small_cfg, reps)``: ``ModelFamily.representative_config``. The small model keeps the first
    block of each vision block kind and the first decoder layer of each layer kind."""
    blocks, layers = _kinds(cfg)
    keep_b = [blocks.index(k) for k in dict.fromkeys(blocks)]
    keep_l = [layers.index(k) for k in dict.fromkeys(layers)]
    d, n = len(blocks), len(layers)
    small_taps = tuple(j for j, i in enumerate(keep_b) if blocks[i])
    small_sparse = tuple(j for j, i in enumerate(keep_l) if layers[i])
    vis = replace(cfg.vision, depth=len(keep_b), fullatt_block_indexes=tuple(range(len(keep_b))))
    arch = replace(cfg.shape.arch, vision=vis, llm=replace(cfg.llm, num_hidden_layers=len(keep_l)))
    extra = {"sparse": small_sparse} if _sparse(cfg) else {}
    shape = replace(cfg.shape, arch=arch, deepstack=small_taps, **extra)
    small = replace(cfg, shape=shape, reduced=(tuple(keep_b), tuple(keep_l)))
    b_kinds = [blocks[i] for i in keep_b]
    l_kinds = [layers[i] for i in keep_l]
    enc = {0: 0, d + 1: len(keep_b) + 1, **{i + 1: b_kinds.index(blocks[i]) + 1 for i in range(d)}}
    m = len(keep_l)
    llm = {0: 0, **{i + 1: l_kinds.index(layers[i]) + 1 for i in range(n)}}
    llm.update({n + 1: m + 1, n + 2: m + 2, n + 3: m + 3})
    return small, {"encoder": enc, "llm": llm}


def reduce_hf(config, reduced: Reduced, sparse: tuple[int, ...] = ()):
    """A copy of transformers' config ``config`` with only the blocks / layers ``reduced`` keeps: vision
    ``depth`` and ``deepstack_visual_indexes`` (the kept tapped blocks), text ``num_hidden_layers`` and,
    for the MoE decoder (``sparse``: the checkpoint's sparse layers), ``mlp_only_layers`` /
    ``decoder_sparse_step`` placing the kept sparse layers where they are in the small model."""
    blocks, layers = reduced
    out = copy.deepcopy(config)
    v, t = out.vision_config, out.text_config
    taps = set(v.deepstack_visual_indexes)
    v.depth = len(blocks)
    v.deepstack_visual_indexes = [j for j, i in enumerate(blocks) if i in taps]
    t.num_hidden_layers = len(layers)
    if hasattr(t, "mlp_only_layers"):
        t.mlp_only_layers = [j for j, i in enumerate(layers) if i not in sparse]
        t.decoder_sparse_step = 1
    if getattr(t, "layer_types", None):
        t.layer_types = [t.layer_types[i] for i in layers]
    return out


def profile_input(cfg, component: str, layer: int, tokens: int, device: torch.device, per_label: bool):
    """``ModelFamily.profile_input``: the one-layer stage's forward args (a ``parts`` dict and the grid or
    batch) and its units. The MoE loss stage also takes the ``router_stats`` part (zeros) its auxiliary
    loss consumes."""
    from entrain.models.families.qwen3_vl.model import HIDDEN

    if component == "encoder":
        vis = cfg.vision
        grid = image_grid(tokens, vis.spatial_merge_size)
        n = grid[1] * grid[2]
        width = vis.patch_dim if layer == 0 else vis.hidden_size
        x = torch.randn((n, width), device=device, requires_grad=layer > 0)
        return ({HIDDEN: x}, torch.tensor([grid], dtype=torch.int64)), n
    batch = text_batch(tokens, cfg.llm.vocab_size, per_label, device)
    n = cfg.llm.num_hidden_layers
    parts: dict[str, torch.Tensor | None] = {}
    if layer == 0:
        parts[HIDDEN] = None
    elif layer == n + 3:  # the loss takes the label positions' logits
        logits = torch.randn((batch.targets.numel(), cfg.llm.vocab_size), device=device, requires_grad=True)
        parts[HIDDEN] = logits
        if getattr(cfg.shape, "aux_loss", False) and _sparse(cfg):
            from entrain.models.families.qwen3_vl_moe.spec import ROUTER_STATS

            parts[ROUTER_STATS] = torch.zeros((1, 2 * cfg.shape.num_experts), device=device)
    else:
        parts[HIDDEN] = torch.randn((1, tokens, cfg.llm.hidden_size), device=device, requires_grad=True)
    return (parts, batch), tokens
