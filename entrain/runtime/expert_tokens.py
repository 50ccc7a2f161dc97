"""A step's routing statistics for ``metrics.jsonl`` (field ``expert_tokens``): per sparse layer of each
stage, the tokens routed to each expert that step, summed over the step's microbatches.

A stage with experts says so with ``take_routing()`` (``{layer: ([E] int64 tokens per expert, tokens
routed)}`` since its last call: the LLM stages of a family with experts); other families' stages have none
and their runs' rows carry no ``expert_tokens``. Under ``--ep N`` each expert computes the tokens of its
whole EP group, so the counts are summed over the group (one all-reduce) and reported once, by the
group's first rank, with ``ranks`` the group's ranks; without it each rank reports its own replica's
(``ranks``: itself). TP ranks of one stage route the same tokens: the first reports them.

One entry: ``{"rank", "ranks", "stage", "layer", "tokens", "top_k", "tokens_per_expert", "max", "mean",
"imbalance"}``, ``layer`` the LLM decoder layer, ``tokens`` the tokens routed (each chose ``top_k``
experts, so ``tokens_per_expert`` sums to ``tokens * top_k``), ``max`` / ``mean`` over the experts and
``imbalance = max / mean`` (1: balanced; 0 tokens: 1).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist

__all__ = ["drop_routing", "routing_entry", "step_expert_tokens"]


def _taken(modules: Mapping[int, torch.nn.Module]) -> list[tuple[int, int, torch.Tensor, int, int]]:
    """``(stage, layer, counts, tokens, top_k)`` of every sparse layer of ``modules`` (stage -> module)."""
    out = []
    for stage, m in sorted(modules.items()):
        take = getattr(m, "take_routing", None)
        if take is not None:
            out += [(stage, layer, c, t, m.top_k) for layer, (c, t) in sorted(take().items())]
    return out


def drop_routing(modules: Mapping[int, torch.nn.Module]) -> None:
    """Start the stages' sums afresh (the forwards since their last read, a validation's, are dropped)."""
    _taken(modules)


def routing_entry(
    rank: int, ranks: list[int], stage: int, layer: int, counts: list[int], tokens: int, top_k: int
) -> dict:
    """One ``expert_tokens`` entry with its summary (module docstring)."""
    mean = sum(counts) / len(counts) if counts else 0.0
    high = max(counts, default=0)
    return {
        "rank": rank,
        "ranks": ranks,
        "stage": stage,
        "layer": layer,
        "tokens": tokens,
        "top_k": top_k,
        "tokens_per_expert": counts,
        "max": high,
        "mean": mean,
        "imbalance": high / mean if mean > 0 else 1.0,
    }


def step_expert_tokens(
    modules: Mapping[int, torch.nn.Module], rank: int, tp_rank: int, ep_groups
) -> list[dict]:
    """This rank's ``expert_tokens`` entries of the step just run (the stages' sums are read and reset).
    Collective over the EP group under ``--ep`` (every rank of a group holds the same stages, so all of
    them call it with the same layers)."""
    taken = _taken(modules)
    if not taken:
        return []
    counts = torch.stack([c for _, _, c, _, _ in taken])
    tokens = torch.tensor([t for _, _, _, t, _ in taken], dtype=torch.int64, device=counts.device)
    ranks = [rank]
    if ep_groups is not None and ep_groups.ep > 1:
        both = torch.cat([counts, tokens[:, None]], dim=1)
        dist.all_reduce(both, group=ep_groups.group)
        counts, tokens = both[:, :-1], both[:, -1]
        if ep_groups.ep_rank != 0:
            return []
        ranks = list(ep_groups.ranks)
    if tp_rank != 0:
        return []
    return [
        routing_entry(rank, ranks, stage, layer, c, t, k)
        for (stage, layer, _, _, k), c, t in zip(taken, counts.tolist(), tokens.tolist(), strict=True)
    ]
