"""The ``cpu-tiny`` preset's split backward: ``I`` takes the input-gradient share measured on the tiny
CPU runs (Entrain traces of ``benchmarks/cpu_pipeline.py --paired``: LLM stages 0.69-0.75), not the
matmuls' 0.5, which made the simulator's ``I`` (on the critical path) 30 % short and its deferred
``W`` (filling bubbles) 45 % long; the GPU presets keep 0.5."""

from __future__ import annotations

import pytest

from entrain.core.costs.presets import build_cost_model
from entrain.core.ir.plan import ActionKind, Layout
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork


def _llm_costs(cost) -> PlanCosts:
    """A 2-stage LLM's ``PlanCosts`` over one 256-token sample ``s``."""
    layout = Layout.from_json(
        {"dp": 1, "microbatch_size": 1, "num_microbatches": 1,
         "components": {"encoder": {"tp": 1, "cp": 1, "pp": 1}, "llm": {"tp": 1, "cp": 1, "pp": 2}},
         "stages": [{"stage": 0, "component": "encoder", "layers": [0, 4], "pp_rank": 0},
                    {"stage": 1, "component": "llm", "layers": [0, 2], "pp_rank": 0},
                    {"stage": 2, "component": "llm", "layers": [2, 6], "pp_rank": 1}]}
    )  # fmt: skip
    meta = SampleMeta("s", images=(), text_tokens=256, answer_tokens=64)
    return PlanCosts(layout, cost, {"s": SampleWork("s", 0.0, 0.0, meta=meta)})


def _llm_split(cost) -> float:
    """``I / (I + W)`` of the 2-stage LLM's second stage."""
    costs = _llm_costs(cost)
    i, w = (costs.compute_ms(2, k, ("s",)) for k in (ActionKind.I, ActionKind.W))
    return i / (i + w)


def test_a_split_backward_costs_its_measured_extra_on_the_cpu():
    """``I`` + ``W`` = the whole backward's layers times ``1 + split_extra_fraction`` plus
    ``split_extra_ms`` per layer (each action also pays the per-action overhead): what the paired
    traces measured (``benchmarks/fit_cpu_tiny.py``: decoder layers about 8 % more)."""
    cost = build_cost_model("tiny", "cpu-tiny")
    costs = _llm_costs(cost)
    overhead = cost.hardware.action_overhead_ms
    b, i, w = (costs.compute_ms(2, k, ("s",)) - overhead for k in (ActionKind.B, ActionKind.I, ActionKind.W))
    layers = cost.llm.layers[2:6]
    extra = sum(
        cost.layer_ms("llm", 2 + n, (256,), "bwd", labels=(64,)) * x.split_extra_fraction + x.split_extra_ms
        for n, x in enumerate(layers)
    )
    assert extra > 0.05 * b
    assert i + w == pytest.approx(b + extra, rel=1e-9)


@pytest.mark.parametrize("hardware", ["a40-paper", "a40-flops", "a40-fig4"])
def test_gpu_presets_price_a_split_backward_as_the_whole_one(hardware):
    costs = _llm_costs(build_cost_model("tiny", hardware))
    b, i, w = (costs.compute_ms(2, k, ("s",)) for k in (ActionKind.B, ActionKind.I, ActionKind.W))
    assert i + w == pytest.approx(b, rel=1e-12)


def test_cpu_tiny_input_share_is_the_measured_one():
    assert 0.69 <= _llm_split(build_cost_model("tiny", "cpu-tiny")) <= 0.76


@pytest.mark.parametrize("hardware", ["a40-paper", "a40-flops", "a40-fig4"])
def test_gpu_presets_keep_half(hardware):
    cost = build_cost_model("qwen25vl-llama3-1b", hardware)
    fractions = {layer.bwd_input_fraction for c in (cost.encoder, cost.llm) for layer in c.layers}
    assert fractions == {0.0, 0.5}
