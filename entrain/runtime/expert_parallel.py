"""Expert parallelism inside a pipeline stage (``train --ep N``).

Each mixture-of-experts layer's experts are sharded over ``N`` ranks of the stage's data-parallel
group (an *EP group*: ``N`` consecutive DP replicas, ``replica // N`` the same); every rank holds
``num_experts / N`` consecutive experts and runs the router, attention and everything else as plain
data parallelism. A layer's forward on one rank:

1. sort its ``[T, k]`` routed (token, expert) pairs by expert (stable), count them per expert;
2. exchange the per-expert counts with the EP group (``all_to_all_single`` of ``[N, E/N]``);
3. *dispatch*: send each routed token's hidden state to the rank of its expert (``all_to_all_single``
   with those splits); run each local expert (transformers' SwiGLU expert: ``down(act(gate) * up)``)
   over the rows it received from every rank;
4. *combine*: send the outputs back (the reverse ``all_to_all_single``), scale by the routing weights
   and add them into the tokens' rows, as transformers' expert loop does.

Backward runs the two all-to-alls in reverse (``_AllToAll``). The expert parameters are DTensors
sharded (``Shard(0)``) over a 1-D mesh of the EP group, so their gradients are the owner's sum over
every token of the group, the global-norm clip counts each shard once (``parallelize.copies``), and a
``torch.distributed.checkpoint`` save holds each expert tensor as its global tensor, which a run at
another ``--ep`` reads resharded. The gradient all-reduce of an expert parameter runs over the
*expert replicas* only: the ``dp / N`` ranks of the stage holding the same experts (``grad_buckets``).

The collectives' order: every rank of an EP group runs the same pipeline rank's LLM computations (kind,
microbatch, sub-microbatch, in one order; the token counts may differ), and each forward / backward of
a sparse layer makes the same collectives; ``check_same_actions`` refuses a step whose LLM computations
differ between the replicas of an EP group (their all-to-alls would not pair up, or meet in another
order). Entrain's plans give a group one LLM program (``schedules.entrain``) and each replica its own
encoder microbatches.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from entrain.core.errors import ConfigError

__all__ = [
    "EpGroups",
    "ShardedExperts",
    "build_ep_groups",
    "apply_ep",
    "check_ep",
    "check_same_actions",
    "is_expert_param",
]


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows with autograd: backward sends the gradients the reverse way."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


def _all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    return _AllToAll.apply(x, send, recv, group)


class ShardedExperts(nn.Module):
    """Transformers' fused experts module (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``,
    ``act_fn``; called as ``experts(hidden [T, H], top_k_index [T, k], top_k_weights [T, k])``) with
    this rank's ``E / N`` experts, dispatching and combining over ``group`` (module docstring)."""

    def __init__(self, experts: nn.Module, group, mesh, ep_rank: int, ep: int):
        super().__init__()
        from torch.distributed.tensor import DTensor, Shard

        self.num_experts = experts.num_experts
        self.per_rank = self.num_experts // ep
        self.ep, self.ep_rank, self.group = ep, ep_rank, group
        self.act_fn = experts.act_fn
        lo, hi = ep_rank * self.per_rank, (ep_rank + 1) * self.per_rank
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(experts, name)
            shard = DTensor.from_local(full.detach()[lo:hi].clone(), mesh, [Shard(0)], run_check=False)
            param = nn.Parameter(shard, requires_grad=full.requires_grad)
            param.entrain_expert = True
            setattr(self, name, param)

    def _local(self, name: str) -> torch.Tensor:
        return getattr(self, name).to_local()

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        k = top_k_index.shape[1]
        flat = top_k_index.reshape(-1)
        with torch.no_grad():
            valid = flat < self.num_experts  # transformers skips index num_experts (a dropped slot)
            order = torch.argsort(torch.where(valid, flat, self.num_experts), stable=True)
            order = order[: int(valid.sum())]
            counts = torch.bincount(flat[order], minlength=self.num_experts).view(self.ep, self.per_rank)
            got = torch.empty_like(counts)
            dist.all_to_all_single(got, counts.contiguous(), group=self.group)
            send, recv = counts.sum(1).tolist(), got.sum(1).tolist()
            # received rows: per source rank, sorted by local expert; regroup them by local expert
            local_expert = torch.repeat_interleave(
                torch.arange(self.per_rank, device=got.device).repeat(self.ep), got.reshape(-1)
            )
            by_expert = torch.argsort(local_expert, stable=True)
            per_expert = got.sum(0).tolist()
        tokens = order // k
        rows = _all_to_all(hidden[tokens], send, recv, self.group)
        gate_up, down = self._local("gate_up_proj"), self._local("down_proj")
        outs = []
        for e, part in enumerate(torch.split(rows[by_expert], per_expert)):
            gate, up = nn.functional.linear(part, gate_up[e]).chunk(2, dim=-1)
            outs.append(nn.functional.linear(self.act_fn(gate) * up, down[e]))
        computed = torch.cat(outs) if outs else rows
        back = torch.empty_like(computed).index_copy(0, by_expert, computed)
        out = _all_to_all(back, recv, send, self.group)
        out = out * top_k_weights.reshape(-1)[order, None]
        return torch.zeros_like(hidden).index_add(0, tokens, out.to(hidden.dtype))


@dataclass
class EpGroups:
    """This process's EP group (its stage's ``ep`` DP replicas sharing the experts) and its expert
    replicas (the ranks of its stage holding the same experts; None when ``dp == ep``)."""

    ep: int
    ep_rank: int
    group: dist.ProcessGroup
    ranks: list[int]
    replicas: dist.ProcessGroup | None
    replica_ranks: list[int]


def build_ep_groups(
    dp_ranks_of: list[list[int]], me: int, ep: int, timeout_s: float | None = None
) -> EpGroups:
    """Every process calls this with every stage group's DP ranks (``dp_ranks_of``: one list per
    pipeline rank and TP rank, replica order), creating the groups in one order (``new_group`` is
    collective)."""
    kwargs = {"timeout": timedelta(seconds=timeout_s)} if timeout_s is not None else {}
    mine = None
    for ranks in dp_ranks_of:
        dp = len(ranks)
        eps = [ranks[g * ep : (g + 1) * ep] for g in range(dp // ep)]
        reps = [ranks[j::ep] for j in range(ep)]
        made_ep = [dist.new_group(r, **kwargs) for r in eps]
        made_rep = [dist.new_group(r, **kwargs) if len(r) > 1 else None for r in reps]
        if me in ranks:
            d = ranks.index(me)
            mine = EpGroups(ep, d % ep, made_ep[d // ep], eps[d // ep], made_rep[d % ep], reps[d % ep])
    if mine is None:
        raise RuntimeError(f"process {me} is in no stage's data-parallel group")
    return mine


def check_ep(
    ep: int, dp: int, *, num_experts: int | None, tp: int = 1, fsdp: bool = False, cross_replica: bool = False
) -> None:
    """ConfigError unless ``--ep`` can run: it divides ``dp`` and the experts, on an MoE model, without
    TP or FSDP, in a run whose replicas exchange no encoder work (``cross_replica``: their programs then
    differ, ``check_same_actions``)."""
    if ep < 1:
        raise ConfigError(f"--ep must be at least 1, got {ep}")
    if ep == 1:
        return
    if num_experts is None:
        raise ConfigError(f"--ep {ep} shards mixture-of-experts layers; this model has none: use --ep 1")
    if tp > 1 or fsdp:
        raise ConfigError(
            f"--ep {ep} does not compose with {'--tp' if tp > 1 else '--fsdp'} yet; use one of them"
        )
    if cross_replica:
        raise ConfigError(
            f"--ep {ep} needs replicas that run the same programs; this system moves encoder work across "
            "replicas: use --ep 1, or --encoder-rebalance off / another --system"
        )
    if dp % ep or num_experts % ep:
        raise ConfigError(
            f"--ep {ep} must divide --dp ({dp}) and the number of experts ({num_experts}): each expert "
            "lives on one rank of every group of --ep data-parallel replicas"
        )


def apply_ep(stage: nn.Module, groups: EpGroups, device_type: str) -> list[nn.Parameter]:
    """Replace every experts module (``mlp.experts`` with fused ``gate_up_proj``) of ``stage``'s
    layers by its ``ShardedExperts``; returns the new expert parameters."""
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(groups.group, device_type)
    made = []
    for module in list(stage.modules()):
        experts = getattr(getattr(module, "mlp", None), "experts", None)
        if experts is None or not hasattr(experts, "gate_up_proj") or isinstance(experts, ShardedExperts):
            continue
        sharded = ShardedExperts(experts, groups.group, mesh, groups.ep_rank, groups.ep)
        module.mlp.experts = sharded
        made += [sharded.gate_up_proj, sharded.down_proj]
    return made


def is_expert_param(p: torch.Tensor) -> bool:
    return bool(getattr(p, "entrain_expert", False))


def check_same_actions(actions, groups: EpGroups, device: torch.device, stages=None) -> None:
    """ConfigError on every process unless the replicas of each EP group run the same computations
    this step (kind, stage, microbatch, sub-microbatch) on ``stages`` (the LLM's; None: every action,
    sends and receives too). Each sparse layer's all-to-alls are then at the same place in the
    replicas' programs (their token counts may differ: the splits are exchanged first). Expert
    parallelism then adds no deadlock to a plan whose every replica the checker passed
    (``entrain.core.ir.p2p``): the LLM ranks run one program, its p2p edges between LLM stages the same
    in each replica, and a replica's encoder ranks exchange messages only with its first LLM rank,
    which runs them in its own order whatever the other replicas' pace (Entrain's plans give each
    replica its own encoder microbatches and deferrals, ``schedules.entrain``). One all-gather over the
    world, so that every process stops together."""
    kept = [
        (a.kind.name, a.stage, a.mb, a.sub)
        for a in actions
        if stages is None or (a.stage in stages and a.kind.is_compute)
    ]
    key = repr(kept)
    mine = torch.tensor(
        [min(groups.ranks), zlib.crc32(key.encode()), len(kept)],
        dtype=torch.int64,
        device=device,
    )
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    seen: dict[int, tuple[int, int]] = {}
    for t in every:
        group, crc, n = (int(v) for v in t)
        if seen.setdefault(group, (crc, n)) != (crc, n):
            raise ConfigError(
                f"--ep {groups.ep}: data-parallel replicas of one expert-parallel group run different LLM "
                "computations this step (their microbatches are split differently), so their all-to-alls "
                "would not pair up; use --ep 1 or a plan whose replicas run the same LLM microbatches"
            )
