"""The tiny mixture-of-experts cost model the planner, simulator and cost tests price by hand: one
encoder layer and ``sparse`` LLM layers of 8 experts, top 2, each layer ``0.01`` ms a token plus
``call_ms`` a call forward (the backward twice that), 1000 parameter bytes (800 of them the experts'),
512 all-to-all bytes a routed token."""

from __future__ import annotations

from entrain.core.costs.costmodel import (
    ComponentCost,
    CostModel,
    ExpertCost,
    HardwareSpec,
    LayerCost,
    Quadratic,
)

KEY = "tp1cp1"
EXPERTS = ExpertCost(num_experts=8, top_k=2, fraction=0.5, a2a_bytes_per_token=512.0, param_bytes=800.0)


def moe_layer(
    name: str,
    experts: ExpertCost | None = None,
    *,
    call_ms: float = 0.1,
    quad: float = 0.0,
    activation: float = 0.0,
) -> LayerCost:
    """One decoder layer: forward ``quad * x^2 + 0.01 * x + call_ms`` ms on ``x`` tokens, backward twice
    that; ``activation`` bytes kept a token."""
    q = Quadratic(quad, 0.01, call_ms)
    return LayerCost(
        name,
        "decoder_layer",
        {KEY: q},
        {KEY: q.scaled(2.0)},
        param_bytes=1000.0,
        experts=experts,
        activation_bytes_per_token=activation,
    )


def tiny_moe_cost(
    sparse: int = 1,
    *,
    experts: ExpertCost | None = EXPERTS,
    call_ms: float = 0.1,
    quad: float = 0.0,
    activation: float = 0.0,
    allreduce_bandwidth: float = 1e6,
) -> CostModel:
    """The encoder's one layer (linear) and ``sparse`` LLM layers with ``experts`` (None: dense), the
    LLM's ``quad`` times the squared tokens (attention: its work and its tokens not proportional);
    all-reduce ``allreduce_bandwidth`` bytes a ms, 0.05 ms latency."""
    hw = HardwareSpec("hand", allreduce_bandwidth_bytes_per_ms=allreduce_bandwidth, allreduce_latency_ms=0.05)
    llm = tuple(
        moe_layer(f"layers.{i}", experts, call_ms=call_ms, quad=quad, activation=activation)
        for i in range(sparse)
    )
    encoder = (moe_layer("blocks.0", call_ms=call_ms, activation=activation),)
    return CostModel("hand", hw, ComponentCost("encoder", encoder), ComponentCost("llm", llm))
