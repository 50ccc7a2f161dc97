"""The routing skew of a mixture-of-experts run, refitted from its ``metrics.jsonl``
(``entrain profile --from-trace RUN``, beside ``entrain.sim.trace_fit``'s stage refit).

Each sparse LLM layer's ``ExpertCost.skew`` scales the routing model's busiest expert (a uniform
top-k router's expected maximum, ``uniform_router_imbalance``); a run measures the busiest expert's
tokens per step (``expert_tokens``), and the ratio of the two is the skew. Documented in
docs/design.md (``Mixture-of-experts costs``)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import replace

from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.layer_costs import uniform_router_imbalance
from entrain.core.errors import ConfigError

__all__ = ["expert_skews", "refit_experts"]


def expert_skews(metrics: list[dict], cost: CostModel) -> dict[int, float]:
    """Per sparse LLM decoder layer of a run with experts, the routing skew of ``cost``'s routing model
    (``ExpertCost.skew``) that its ``metrics.jsonl`` rows measured: over the layer's ``expert_tokens``
    entries (one per step and reporting rank or EP group), the mean of the busiest expert's tokens over
    the mean (``imbalance``) divided by what a uniform router gives on that entry's routed tokens
    (``uniform_router_imbalance``: the part of the imbalance that sampling alone explains), at least 1;
    empty for a run without experts. ConfigError naming the row and field of a malformed entry or a
    layer the cost model has no experts for."""
    ratios: dict[int, list[float]] = defaultdict(list)
    for n, row in enumerate(metrics):
        for e in row.get("expert_tokens", ()):
            try:
                layer, tokens, counts = (
                    int(e["layer"]),
                    float(e["tokens"]),
                    [float(c) for c in e["tokens_per_expert"]],
                )
                top_k = int(e["top_k"])
            except (KeyError, TypeError, ValueError) as err:
                raise ConfigError(
                    f"metrics.jsonl row {n + 1}: expert_tokens entry {e!r}: bad or missing {err}"
                ) from None
            experts = _experts_of(cost, layer)
            if experts is None:
                raise ConfigError(
                    f"metrics.jsonl row {n + 1}: expert_tokens layer {layer}: the cost model's layers.{layer} has no experts"
                )
            if tokens <= 0 or not counts or sum(counts) <= 0:
                continue
            measured = max(counts) * len(counts) / sum(counts)
            ratios[layer].append(measured / uniform_router_imbalance(tokens, len(counts), top_k))
    return {layer: max(1.0, statistics.fmean(v)) for layer, v in sorted(ratios.items())}


def _experts_of(cost: CostModel, layer: int):
    """The ``ExpertCost`` of LLM decoder layer ``layer`` (the cost model's ``layers.{layer}``)."""
    for x in cost.llm.layers:
        if x.name == f"layers.{layer}":
            return x.experts
    return None


def refit_experts(cost: CostModel, metrics: list[dict]) -> tuple[CostModel, dict[int, float]]:
    """``cost`` with each sparse layer's routing skew measured by the run (``expert_skews``), and those
    skews; ``cost`` itself for a run without experts."""
    skews = expert_skews(metrics, cost)
    if not skews:
        return cost, skews
    names = {f"layers.{layer}": skew for layer, skew in skews.items()}
    layers = tuple(
        replace(x, experts=replace(x.experts, skew=names[x.name])) if x.name in names else x
        for x in cost.llm.layers
    )
    notes = {**cost.notes, "expert_skew": {str(k): v for k, v in skews.items()}}
    return replace(cost, llm=replace(cost.llm, layers=layers), notes=notes), skews
