"""``entrain profile --from-trace`` refits a mixture-of-experts layer's routing skew from the run's
``expert_tokens``: the measured busiest-expert imbalance over what a uniform router gives on the same
tokens (hand-computed here), so the refitted cost model prices the busiest expert the run saw; a run
without experts leaves the cost model as it was, and a malformed entry is named by row and field."""

from __future__ import annotations

from dataclasses import replace

import pytest

from entrain.core.costs.costmodel import (
    ComponentCost,
    CostModel,
    ExpertCost,
    ExpertTiming,
    HardwareSpec,
    LayerCost,
    Quadratic,
)
from entrain.core.errors import ConfigError
from entrain.sim.expert_refit import expert_skews, refit_experts
from entrain.sim.trace_fit import scaled_layer

KEY = "tp1cp1"
Z8 = 1.434203  # Blom's expected largest of 8 standard normals


def _cost() -> CostModel:
    def layer(name, experts=None):
        q = Quadratic(0.0, 0.01, 0.1)
        return LayerCost(
            name, "decoder_layer", {KEY: q}, {KEY: q.scaled(2.0)}, param_bytes=1000.0, experts=experts
        )

    x = ExpertCost(num_experts=8, top_k=2, fraction=0.5, a2a_bytes_per_token=512.0, param_bytes=800.0)
    return CostModel(
        "hand",
        HardwareSpec("hand"),
        ComponentCost("encoder", (layer("blocks.0"),)),
        ComponentCost("llm", (layer("embed_tokens"), layer("layers.0", x), layer("layers.1"))),
    )


def _entry(layer: int, tokens: int, counts: list[int]) -> dict:
    mean = sum(counts) / len(counts)
    return {"rank": 0, "ranks": [0], "stage": 1, "layer": layer, "tokens": tokens, "top_k": 2,
            "tokens_per_expert": counts, "max": max(counts), "mean": mean, "imbalance": max(counts) / mean}  # fmt: skip


def test_skew_is_the_measured_imbalance_over_a_uniform_routers():
    # 64 tokens x top-2 over 8 experts: mean 16; uniform router: 1 + z_8 * sqrt(3/4 * 8 / 128)
    uniform = 1 + Z8 * 0.2165064
    rows = [
        {"step": 1, "expert_tokens": [_entry(0, 64, [32, 16, 16, 16, 16, 16, 8, 8])]},  # imbalance 2
        {"step": 2, "expert_tokens": [_entry(0, 64, [24, 16, 16, 16, 16, 16, 16, 8])]},  # imbalance 1.5
        {"step": 3},  # a row without routing statistics
    ]
    want = (2.0 / uniform + 1.5 / uniform) / 2
    assert expert_skews(rows, _cost()) == {0: pytest.approx(want, rel=1e-5)}
    refit, skews = refit_experts(_cost(), rows)
    assert skews[0] == pytest.approx(want, rel=1e-5)
    assert refit.llm.layers[1].experts.skew == pytest.approx(want, rel=1e-5)
    assert refit.notes["expert_skew"] == {"0": skews[0]}
    # the refitted busiest expert costs more at ep 8 (one expert a rank) than the uniform router's
    assert refit.expert_ms("llm", 1, 64, "fwd", ep=8) > _cost().expert_ms("llm", 1, 64, "fwd", ep=8)


def test_a_balanced_run_keeps_skew_one():
    rows = [{"step": 1, "expert_tokens": [_entry(0, 64, [16] * 8)]}]
    assert expert_skews(rows, _cost()) == {0: 1.0}


def test_a_run_without_experts_leaves_the_cost_model():
    cost = _cost()
    assert refit_experts(cost, [{"step": 1, "loss": 1.0}]) == (cost, {})


@pytest.mark.parametrize(
    "entry,match",
    [
        ({"layer": 0, "tokens": 64, "top_k": 2}, r"row 1: expert_tokens entry .*'tokens_per_expert'"),
        (_entry(1, 64, [16] * 8), r"row 1: expert_tokens layer 1: the cost model's layers.1 has no experts"),
    ],
)
def test_a_bad_entry_is_named(entry, match):
    with pytest.raises(ConfigError, match=match):
        expert_skews([{"step": 1, "expert_tokens": [entry]}], _cost())


def test_a_stage_refit_scales_a_sparse_layers_measured_expert_timing_with_its_curves():
    """The trace refit scales a stage's layer curves by its ``alpha`` per phase; a sparse layer timed by
    ``entrain profile`` (``ExpertCost.measured``) prices its busiest rank's extra expert tokens from
    that timing beside the curves, so the refit scales the phase's slot, call and router ms by the same
    ``alpha``: the refitted layer's extra expert ms is ``alpha`` times the base's in every phase (the
    all-to-all left out: no bytes, no latency)."""
    timing = ExpertTiming(0.002, 0.004, 0.01, 0.02, 0.0005, 0.001)
    x = ExpertCost(8, 2, 0.5, a2a_bytes_per_token=0.0, param_bytes=800.0, skew=1.5, measured=timing)
    hand = _cost()
    llm = list(hand.llm.layers)
    llm[1] = replace(llm[1], experts=x)
    base = replace(
        hand,
        hardware=HardwareSpec("hand", allreduce_latency_ms=0.0),
        llm=replace(hand.llm, layers=tuple(llm)),
    )
    llm[1] = scaled_layer(scaled_layer(llm[1], "fwd", 1.5, 0.2), "bwd", 0.5, 0.3)
    refit = replace(base, llm=replace(base.llm, layers=tuple(llm)))
    m = refit.llm.layers[1].experts.measured
    got = (
        m.fwd_slot_ms,
        m.bwd_slot_ms,
        m.fwd_call_ms,
        m.bwd_call_ms,
        m.router_fwd_ms_per_token,
        m.router_bwd_ms_per_token,
    )
    assert got == pytest.approx((0.003, 0.002, 0.015, 0.01, 0.00075, 0.0005), rel=1e-12)
    for phase, alpha in (("fwd", 1.5), ("bwd", 0.5), ("bwd_split", 0.5), ("bwd_input", 0.5)):
        before = base.expert_ms("llm", 1, 64, phase, ep=8)
        assert before > 0
        assert refit.expert_ms("llm", 1, 64, phase, ep=8) == pytest.approx(alpha * before, rel=1e-9)
