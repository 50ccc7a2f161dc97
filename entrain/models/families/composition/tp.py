"""The composition's tensor-parallel plan and FSDP units.

Tensor parallel (``torch.distributed.tensor.parallel``), per stage:

* Llama layers: ``q/k/v_proj`` column-wise (by heads; N must divide the KV heads), ``o_proj``
  row-wise; ``gate/up_proj`` column-wise, ``down_proj`` row-wise. HF's attention reshapes with
  ``-1`` heads, so it runs on the local heads unchanged.
* Qwen vision blocks: the fused ``attn.qkv`` is split into ``attn.qkv.q/k/v`` (``SplitQKV``: one
  contiguous column shard of the fused weight would mix q, k and v), each column-wise by heads, and
  ``attn.num_heads`` becomes the local head count; ``attn.proj`` row-wise; the MLP as Llama's
  (Qwen2-VL's tower: ``fc1`` column-wise, ``fc2`` row-wise). The merger's MLP is column- then
  row-wise.
* Embeddings and lm_head as torchtitan does without loss parallelism: ``embed_tokens`` row-wise (the
  vocabulary sharded, outputs all-reduced), ``lm_head`` column-wise with replicated (all-gathered)
  logits. Norms and the patch embedding stay replicated.
"""

from __future__ import annotations

import torch
from torch import nn

from entrain.core.errors import ConfigError
from entrain.models.families.composition.vlm import EncoderStage

__all__ = ["SplitQKV", "split_fused_qkv", "check_tp", "apply_tp", "fsdp_units", "fc_plan", "tp_llm_stage"]


def check_tp(arch, tp: int) -> None:
    """ConfigError unless ``tp`` divides every sharded dimension of ``arch`` (a ``ModelArch``)."""
    if tp == 1:
        return
    vis, llm = arch.vision.hf_kwargs(), arch.llm.hf_kwargs()
    dims = {
        "vision heads": vis["num_heads"],
        "vision MLP width": vis["intermediate_size"],
        "LLM attention heads": llm["num_attention_heads"],
        "LLM KV heads": llm.get("num_key_value_heads") or llm["num_attention_heads"],
        "LLM MLP width": llm["intermediate_size"],
        "vocabulary": llm["vocab_size"],
    }
    bad = {k: v for k, v in dims.items() if v % tp}
    if bad:
        raise ConfigError(
            f"--tp {tp} must divide the sharded dimensions of the model: "
            + ", ".join(f"{k} {v}" for k, v in bad.items())
        )


# --- tensor parallel ---------------------------------------------------------------------------


class SplitQKV(nn.Module):
    """A fused ``qkv`` Linear (output ``[q | k | v]``) as three Linears ``q``, ``k``, ``v`` with the
    same values, so each can be column-sharded by heads; the forward concatenates the (local)
    outputs, which ``[seq, 3, local heads, head_dim]`` reshapes correctly."""

    def __init__(self, fused: nn.Linear):
        super().__init__()
        d_in, d = fused.in_features, fused.out_features // 3
        bias = fused.bias is not None
        for i, part in enumerate("qkv"):
            lin = nn.Linear(d_in, d, bias=bias, device=fused.weight.device, dtype=fused.weight.dtype)
            with torch.no_grad():
                lin.weight.copy_(fused.weight[i * d : (i + 1) * d])
                if bias:
                    lin.bias.copy_(fused.bias[i * d : (i + 1) * d])
            lin.weight.requires_grad_(fused.weight.requires_grad)
            if bias:
                lin.bias.requires_grad_(fused.bias.requires_grad)
            setattr(self, part, lin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1)


def _mlp_plan(prefix: str) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        f"{prefix}gate_proj": ColwiseParallel(),
        f"{prefix}up_proj": ColwiseParallel(),
        f"{prefix}down_proj": RowwiseParallel(),
    }


def split_fused_qkv(stage) -> None:
    """Give the vision attentions of an encoder stage ``SplitQKV`` (before TP or FSDP turn its
    parameters into DTensors, whose thirds would no longer be views for the checkpoint's names)."""
    if isinstance(stage, EncoderStage):
        for i in stage.block_ids:
            attn = stage.vis.blocks[i].attn
            if not isinstance(attn.qkv, SplitQKV):
                attn.qkv = SplitQKV(attn.qkv)


def fc_plan(prefix: str) -> dict:
    """A two-matrix MLP (``fc1``, activation, ``fc2``): ``fc1`` column-wise, ``fc2`` row-wise."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {f"{prefix}fc1": ColwiseParallel(), f"{prefix}fc2": RowwiseParallel()}


def _tp_vision_block(block: nn.Module, mesh) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    attn = block.attn
    plan = {f"attn.qkv.{p}": ColwiseParallel() for p in "qkv"}
    plan["attn.proj"] = RowwiseParallel()
    plan.update(fc_plan("mlp.") if hasattr(block.mlp, "fc1") else _mlp_plan("mlp."))
    parallelize_module(block, mesh, plan)
    attn.num_heads //= mesh.size()


def _tp_llm_layer(layer: nn.Module, mesh) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {f"self_attn.{p}_proj": ColwiseParallel() for p in "qkv"}
    plan["self_attn.o_proj"] = RowwiseParallel()
    plan.update(_mlp_plan("mlp."))
    parallelize_module(layer, mesh, plan)


def apply_tp(stage, mesh) -> None:
    """Tensor-parallelise the layers stage ``stage`` owns over ``mesh`` (its TP group); the fused qkv
    is split first (``split_fused_qkv``)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if isinstance(stage, EncoderStage):
        vis = stage.vis
        split_fused_qkv(stage)
        for i in stage.block_ids:
            _tp_vision_block(vis.blocks[i], mesh)
        if stage.has_merger:
            parallelize_module(vis.merger.mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        return
    tp_llm_stage(stage, mesh)


def tp_llm_stage(stage, mesh) -> None:
    """Tensor-parallelise an LLM stage (``vlm.LLMStage`` or a family's subclass): embedding, decoder
    layers, lm_head."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    inner = stage.llm.model
    if stage.has_embed:
        parallelize_module(
            inner.embed_tokens, mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        )
    for i in stage.layer_ids:
        _tp_llm_layer(inner.layers[i], mesh)
    if stage.has_lm_head:
        parallelize_module(stage.llm.lm_head, mesh, ColwiseParallel(output_layouts=Replicate()))


def fsdp_units(stage) -> list[nn.Module]:
    """The per-layer FSDP units of ``stage``: its ViT blocks or decoder layers."""
    if isinstance(stage, EncoderStage):
        return [stage.vis.blocks[i] for i in stage.block_ids]
    return [stage.llm.model.layers[i] for i in stage.layer_ids]
