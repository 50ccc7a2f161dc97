"""Parallelisms inside one rank's pipeline stages, applied in torchtitan's order by short functions
that each own one: pipeline stages (the Plan, ``build_stage``) -> tensor parallel (``apply_tp``) ->
activation recomputation (the runtime's recompute step) -> FSDP (``apply_fsdp``).

Process ranks. A Plan names *plan ranks* (``Layout.global_rank(replica, pp_rank)``); with ``--tp N``
every plan rank is a group of N processes, process rank ``plan_rank * N + tp_rank`` (TP innermost,
so a TP group is contiguous, as on one node). All N processes of a plan rank run the same action
list on the same data.

Who sends what. Stage-to-stage activations and their gradients are *replicated* across a TP group
(each TP layer ends in an all-reduce or all-gather), so TP rank ``t`` of the sending plan rank sends
its whole copy to TP rank ``t`` of the receiving one: N independent, identical variable-shape
messages per boundary, through the same metadata-first transport as without TP
(``entrain.runtime.comm``). Nothing is sharded on the wire, so shapes never depend on N.

Tensor parallel (``torch.distributed.tensor.parallel``), per stage:

* Llama layers: ``q/k/v_proj`` column-wise (by heads; N must divide the KV heads), ``o_proj``
  row-wise; ``gate/up_proj`` column-wise, ``down_proj`` row-wise. HF's attention reshapes with
  ``-1`` heads, so it runs on the local heads unchanged.
* Qwen vision blocks: the fused ``attn.qkv`` is split into ``attn.qkv.q/k/v`` (``SplitQKV``: one
  contiguous column shard of the fused weight would mix q, k and v), each column-wise by heads, and
  ``attn.num_heads`` becomes the local head count; ``attn.proj`` row-wise; the MLP as Llama's. The
  merger's MLP is column- then row-wise.
* Embeddings and lm_head as torchtitan does without loss parallelism: ``embed_tokens`` row-wise (the
  vocabulary sharded, outputs all-reduced), ``lm_head`` column-wise with replicated (all-gathered)
  logits. Norms and the patch embedding stay replicated.

FSDP2 (``fully_shard``) shards each stage's parameters, gradients and AdamW state over the stage's
data-parallel group (a 2-D ``dp x tp`` mesh with TP): one unit per layer, one for the rest of the
stage. ``reshard_after_forward=False``: under pipelining a stage runs many microbatches' forwards and
backwards interleaved, and resharding after each forward would all-gather the stage's weights again
for every backward (torchtitan makes the same choice when pipelining); a stage holds only its own
layers, so keeping them unsharded between forward and backward costs 1/PP of the model. Gradients
are reduce-scattered once per step, after the last backward (``FsdpStage.finish_backward``), not per
microbatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from entrain.core.errors import ConfigError
from entrain.core.p2p import layout_channels
from entrain.core.plan import Layout

__all__ = [
    "StageParallelism",
    "Placement",
    "Groups",
    "SplitQKV",
    "split_fused_qkv",
    "placement",
    "process_rank",
    "build_groups",
    "check_tp",
    "apply_tp",
    "apply_fsdp",
    "finish_fsdp_backward",
    "local",
    "copies",
]


@dataclass(frozen=True, slots=True)
class StageParallelism:
    """Parallelism inside each pipeline stage (``train --tp``, ``--fsdp``)."""

    tp: int = 1
    fsdp: bool = False


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a process sits: its plan rank (the Plan's rank), its TP rank and the TP degree."""

    plan_rank: int
    tp_rank: int
    tp: int


def placement(rank: int, tp: int) -> Placement:
    return Placement(rank // tp, rank % tp, tp)


def process_rank(plan_rank: int, tp_rank: int, tp: int) -> int:
    return plan_rank * tp + tp_rank


@dataclass
class Groups:
    """This process's groups: data-parallel (same pipeline rank and TP rank in every replica) and
    tensor-parallel (the processes of its plan rank); None where the degree is 1."""

    dp: dist.ProcessGroup | None
    dp_ranks: list[int]
    tp: dist.ProcessGroup | None
    tp_ranks: list[int]
    channels: dict[tuple[int, int], dist.ProcessGroup] = field(default_factory=dict)
    """Point-to-point group of each channel (sender, receiver plan ranks) this process talks on (its
    TP rank's copy): one communicator per direction, ``entrain.core.p2p``."""


def build_groups(layout: Layout, tp: int, rank: int, timeout_s: float | None = None) -> Groups:
    """Every process calls this (``new_group`` is collective), creating every group in one order."""
    kwargs = {"timeout": timedelta(seconds=timeout_s)} if timeout_s is not None else {}
    me = placement(rank, tp)
    _, my_pp = layout.replica_of(me.plan_rank)
    dp_group, dp_ranks, tp_group, tp_ranks = None, [rank], None, [rank]
    for pp in range(layout.ranks_per_replica):
        for t in range(tp):
            ranks = [process_rank(layout.global_rank(r, pp), t, tp) for r in range(layout.dp)]
            group = dist.new_group(ranks, **kwargs) if layout.dp > 1 else None
            if pp == my_pp and t == me.tp_rank:
                dp_group, dp_ranks = group, ranks
    if tp > 1:
        for plan_rank in range(layout.world_size):
            ranks = [process_rank(plan_rank, t, tp) for t in range(tp)]
            group = dist.new_group(ranks, **kwargs)
            if plan_rank == me.plan_rank:
                tp_group, tp_ranks = group, ranks
    return Groups(dp_group, dp_ranks, tp_group, tp_ranks, _channel_groups(layout, tp, me, kwargs))


def _channel_groups(layout: Layout, tp: int, me: Placement, kwargs: dict) -> dict[tuple[int, int], dist.ProcessGroup]:
    """One group per channel and TP rank, created by every process in one order."""
    out = {}
    for src, dst in layout_channels(layout):
        for t in range(tp):
            group = dist.new_group([process_rank(src, t, tp), process_rank(dst, t, tp)], **kwargs)
            if t == me.tp_rank and me.plan_rank in (src, dst):
                out[(src, dst)] = group
    return out


def check_tp(cfg, tp: int) -> None:
    """ConfigError unless ``tp`` divides every sharded dimension of model config ``cfg``."""
    if tp < 1:
        raise ConfigError(f"--tp must be at least 1, got {tp}")
    if tp == 1:
        return
    vis, llm = cfg.vision.hf_kwargs(), cfg.llm.hf_kwargs()
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
    from entrain.models.vlm import EncoderStage

    if isinstance(stage, EncoderStage):
        for i in stage.block_ids:
            attn = stage.vis.blocks[i].attn
            if not isinstance(attn.qkv, SplitQKV):
                attn.qkv = SplitQKV(attn.qkv)


def _tp_vision_block(block: nn.Module, mesh) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    attn = block.attn
    plan = {f"attn.qkv.{p}": ColwiseParallel() for p in "qkv"}
    plan["attn.proj"] = RowwiseParallel()
    plan.update(_mlp_plan("mlp."))
    parallelize_module(block, mesh, plan)
    attn.num_heads //= mesh.size()


def _tp_llm_layer(layer: nn.Module, mesh) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {f"self_attn.{p}_proj": ColwiseParallel() for p in "qkv"}
    plan["self_attn.o_proj"] = RowwiseParallel()
    plan.update(_mlp_plan("mlp."))
    parallelize_module(layer, mesh, plan)


def apply_tp(stage, mesh) -> None:
    """Tensor-parallelise the layers stage ``stage`` owns over ``mesh`` (its TP group)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from entrain.models.vlm import EncoderStage

    if isinstance(stage, EncoderStage):
        vis = stage.vis
        split_fused_qkv(stage)
        for i in stage.block_ids:
            _tp_vision_block(vis.blocks[i], mesh)
        if stage.has_merger:
            parallelize_module(vis.merger.mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        return
    inner = stage.llm.model
    if stage.has_embed:
        parallelize_module(
            inner.embed_tokens, mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        )
    for i in stage.layer_ids:
        _tp_llm_layer(inner.layers[i], mesh)
    if stage.has_lm_head:
        parallelize_module(stage.llm.lm_head, mesh, ColwiseParallel(output_layouts=Replicate()))


# --- FSDP --------------------------------------------------------------------------------------


def _layers(stage) -> list[nn.Module]:
    from entrain.models.vlm import EncoderStage

    if isinstance(stage, EncoderStage):
        return [stage.vis.blocks[i] for i in stage.block_ids]
    return [stage.llm.model.layers[i] for i in stage.layer_ids]


def apply_fsdp(stage, mesh):
    """``fully_shard`` the stage over ``mesh`` (its DP group, or ``dp x tp``): one unit per layer,
    then the stage module itself as the root unit holding the stage's other parameters (the layers of
    other stages, which the stage module can reach, are ignored). Gradients are summed, not averaged
    (the loss is already divided by the global label count), accumulate unsharded over the step's
    microbatches and are reduce-scattered by ``finish_fsdp_backward``. Returns the root."""
    from torch.distributed.fsdp import fully_shard

    split_fused_qkv(stage)
    owned = {id(p) for _, p in stage.owned_parameters()}
    ignored = {p for p in stage.parameters() if id(p) not in owned}
    units = [fully_shard(m, mesh=mesh, reshard_after_forward=False) for m in _layers(stage)]
    root = fully_shard(stage, mesh=mesh, reshard_after_forward=False, ignored_params=ignored)
    for unit in [*units, root]:
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
    root.set_requires_gradient_sync(False)
    root.set_reshard_after_backward(False)
    return root


def finish_fsdp_backward(root) -> None:
    """After a step's last backward: reduce-scatter the accumulated gradients over the DP group and
    reshard (what ``torch.distributed.pipelining`` does at its REDUCE_GRAD action)."""
    from torch.distributed.fsdp import fully_shard

    root.set_requires_gradient_sync(True)
    root.set_reshard_after_backward(True)
    state = fully_shard.state(root)
    for sub in state._state_ctx.all_states:
        for group in sub._fsdp_param_groups:
            group.post_backward()
    state._root_post_backward_final_callback()
    root.set_requires_gradient_sync(False)
    root.set_reshard_after_backward(False)


# --- tensors that may be DTensors ----------------------------------------------------------------


def local(t: torch.Tensor) -> torch.Tensor:
    """This process's part of ``t`` (the local shard of a DTensor, else ``t``)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def copies(t: torch.Tensor, holders: int) -> int:
    """How many processes hold an identical copy of ``t``'s local part, when ``holders`` processes
    hold the stage (DP x TP): all of them for a plain tensor, ``holders`` over the number of distinct
    shards for a DTensor."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if not isinstance(t, DTensor):
        return holders
    shards = 1
    for dim, p in enumerate(t.placements):
        if isinstance(p, (Shard, _StridedShard)):  # _StridedShard: FSDP's over a TP shard
            shards *= t.device_mesh.size(dim)
    return holders // shards
