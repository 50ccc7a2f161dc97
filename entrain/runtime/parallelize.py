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

Tensor parallel (``torch.distributed.tensor.parallel``), per stage: the model family's plan
(``ModelFamily.apply_tp``; e.g. ``entrain.models.families.composition.tp``).

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

from entrain.core.errors import ConfigError
from entrain.core.ir.plan import Layout
from entrain.runtime.channel_groups import build_channel_groups

__all__ = [
    "StageParallelism",
    "Placement",
    "Groups",
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
    """Parallelism inside each pipeline stage (``train --tp``, ``--fsdp``, ``--ep``)."""

    tp: int = 1
    fsdp: bool = False
    ep: int = 1
    """Expert parallelism over the stage's DP group (``expert_parallel``)."""


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
    TP rank's copy): one communicator per direction, ``entrain.core.ir.p2p``."""


def build_groups(
    layout: Layout, tp: int, rank: int, timeout_s: float | None = None, cross_replica: bool = False
) -> Groups:
    """Every process calls this (``new_group`` is collective), creating every group in one order;
    ``cross_replica``: with the point-to-point channels between replicas (``channel_groups``)."""
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
    channels = _channel_groups(layout, tp, me, kwargs, cross_replica)
    return Groups(dp_group, dp_ranks, tp_group, tp_ranks, channels)


def _channel_groups(
    layout: Layout, tp: int, me: Placement, kwargs: dict, cross_replica: bool = False
) -> dict[tuple[int, int], dist.ProcessGroup]:
    """This process's group of each channel it is on: NCCL splits the world once per round of disjoint
    channels, gloo makes one group per channel and TP rank (``channel_groups``)."""
    split = dist.split_group if dist.get_backend() == "nccl" else None
    return build_channel_groups(
        layout,
        tp,
        me.plan_rank,
        me.tp_rank,
        new_group=dist.new_group,
        split=split,
        cross_replica=cross_replica,
        **kwargs,
    )


def check_tp(shape, tp: int, family=None) -> None:
    """ConfigError unless ``tp`` is at least 1 and divides every dimension the model family's TP plan
    shards (``ModelFamily.check_tp``; ``family``: the family of ``shape``)."""
    if tp < 1:
        raise ConfigError(f"--tp must be at least 1, got {tp}")
    if tp > 1 and family is not None:
        family.check_tp(shape, tp)


def apply_tp(stage, mesh) -> None:
    """Tensor-parallelise the layers stage ``stage`` owns over ``mesh`` (its TP group): the stage's
    model family's TP plan (``ModelFamily.prepare_for_sharding`` then ``apply_tp``)."""
    from entrain.models.families.registry import family_of

    family = family_of(stage)
    family.prepare_for_sharding(stage)
    family.apply_tp(stage, mesh)


# --- FSDP --------------------------------------------------------------------------------------


def apply_fsdp(stage, mesh):
    """``fully_shard`` the stage over ``mesh`` (its DP group, or ``dp x tp``): one unit per layer,
    then the stage module itself as the root unit holding the stage's other parameters (the layers of
    other stages, which the stage module can reach, are ignored). Gradients are summed, not averaged
    (the loss is already divided by the global label count), accumulate unsharded over the step's
    microbatches and are reduce-scattered by ``finish_fsdp_backward``. Returns the root."""
    from torch.distributed.fsdp import fully_shard

    from entrain.models.families.registry import family_of

    family = family_of(stage)
    family.prepare_for_sharding(stage)
    owned = {id(p) for _, p in stage.owned_parameters()}
    ignored = {p for p in stage.parameters() if id(p) not in owned}
    units = [fully_shard(m, mesh=mesh, reshard_after_forward=False) for m in family.fsdp_units(stage)]
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
