"""The composition's tensor-parallel plan and FSDP units.

Tensor parallel (``torch.distributed.tensor.parallel``), per stage:

* Llama layers: ``q/k/v_proj`` column-wise (by heads), ``o_proj`` row-wise; ``gate/up_proj``
  column-wise, ``down_proj`` row-wise. HF's attention reshapes with ``-1`` heads, so it runs on the
  local heads unchanged. With fewer KV heads than TP ranks (GQA/MQA; N a multiple of the KV heads),
  the KV heads are replicated as Megatron and vLLM do (``replicate_kv_heads``): ``k/v_proj`` stay
  whole on every rank, each rank uses the KV head its query heads read, and the gradient of the
  projections' output is summed over the TP group.
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
from entrain.models.families.composition.model import EncoderStage

__all__ = [
    "SplitQKV",
    "split_fused_qkv",
    "check_tp",
    "check_tp_dims",
    "apply_tp",
    "fsdp_units",
    "fc_plan",
    "tp_llm_stage",
    "replicate_kv_heads",
]


def check_tp(arch, tp: int) -> None:
    """ConfigError unless ``tp`` divides every sharded dimension of ``arch`` (a ``ModelArch``)."""
    if tp == 1:
        return
    vis, llm = arch.vision.hf_kwargs(), arch.llm.hf_kwargs()
    dims = {
        "vision heads": vis["num_heads"],
        "vision MLP width": vis["intermediate_size"],
        "LLM attention heads": llm["num_attention_heads"],
        "LLM MLP width": llm["intermediate_size"],
        "vocabulary": llm["vocab_size"],
    }
    check_tp_dims(tp, dims, llm.get("num_key_value_heads") or llm["num_attention_heads"])


def check_tp_dims(tp: int, dims: dict[str, int], kv_heads: int) -> None:
    """ConfigError unless ``tp`` divides each of ``dims`` (what the TP plan shards, by name) and the
    LLM's ``kv_heads`` either divides by ``tp`` (sharded) or divides ``tp`` (replicated)."""
    bad = [f"{k} {n}" for k, n in dims.items() if n % tp]
    if kv_heads % tp and tp % kv_heads:
        bad.append(
            f"LLM KV heads (num_key_value_heads) {kv_heads}, which --tp must divide or be a multiple of"
        )
    if bad:
        raise ConfigError(f"--tp {tp} must divide the sharded dimensions of the model: " + ", ".join(bad))


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

    attn = layer.self_attn
    sharded = "qkv" if (attn.k_proj.out_features // attn.head_dim) % mesh.size() == 0 else "q"
    plan = {f"self_attn.{p}_proj": ColwiseParallel() for p in sharded}
    plan["self_attn.o_proj"] = RowwiseParallel()
    plan.update(_mlp_plan("mlp."))
    if sharded == "q":
        replicate_kv_heads(attn, mesh)
    parallelize_module(layer, mesh, plan)


class _SumGradOverGroup(torch.autograd.Function):
    """Identity forward; the backward sums the gradient over ``group`` (Megatron's "copy to the
    tensor-parallel region"): every rank that uses a replicated tensor adds its share."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        import torch.distributed as dist

        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _kv_head_of_rank(module, args, output, *, columns: slice, group):
    return _SumGradOverGroup.apply(output, group)[..., columns]


def replicate_kv_heads(attn: nn.Module, mesh) -> None:
    """Fewer KV heads than TP ranks (``mesh.size()`` a multiple of them): ``k_proj`` / ``v_proj`` stay
    whole, replicated on every rank (same parameter names and tensors as without TP), and a forward
    hook keeps the KV head this rank's query heads read (rank ``r`` of ``N`` holds query heads
    ``r*H/N ..``; they share KV head ``r // (N / KV)``). The hook sums the projections' output
    gradient over the TP group, so the weights' gradients (and the layer input's) are those of the
    whole attention, equal on every rank."""
    import functools

    tp, rank = mesh.size(), mesh.get_local_rank()
    kv_heads = attn.k_proj.out_features // attn.head_dim
    head = rank // (tp // kv_heads)
    columns = slice(head * attn.head_dim, (head + 1) * attn.head_dim)
    hook = functools.partial(_kv_head_of_rank, columns=columns, group=mesh.get_group())
    for proj in (attn.k_proj, attn.v_proj):
        proj.register_forward_hook(hook)
    attn.num_key_value_groups = attn.q_proj.out_features // attn.head_dim // tp  # local query heads, 1 KV


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
    """Tensor-parallelise an LLM stage (``model.LLMStage`` or a family's subclass): embedding, decoder
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
