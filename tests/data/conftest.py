"""A small hand-built cost model for the data tests (no dependency on the presets)."""

from __future__ import annotations

import pytest

from entrain.core.costs.costmodel import ComponentCost, CostModel, HardwareSpec, LayerCost, Quadratic


def stand_in_cost_model() -> CostModel:
    """One layer per component with FLOP-like per-token costs: a ViT patch costs 2 x 0.675 GFLOP,
    an LLM token 2 x 1.24 GFLOP, at 100 TFLOP/s; backward = 2 x forward; a small attention term."""

    def layer(name: str, a: float, b: float) -> LayerCost:
        return LayerCost(
            name=name,
            kind=name,
            fwd={"tp1cp1": Quadratic(a, b, 0.1)},
            bwd={"tp1cp1": Quadratic(2 * a, 2 * b, 0.2)},
        )

    return CostModel(
        model="stand-in",
        hardware=HardwareSpec("stand-in"),
        encoder=ComponentCost("encoder", (layer("vit", 1e-7, 0.0135),)),
        llm=ComponentCost("llm", (layer("decoder", 1e-7, 0.0248),)),
    )


@pytest.fixture
def cost() -> CostModel:
    return stand_in_cost_model()
