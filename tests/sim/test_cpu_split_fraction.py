"""The ``cpu-tiny`` preset's split backward: ``I`` takes the input-gradient share measured on the tiny
CPU runs (Entrain traces of ``benchmarks/cpu_pipeline.py --paired``: LLM stages 0.69-0.75), not the
matmuls' 0.5, which made the simulator's ``I`` (on the critical path) 30 % short and its deferred
``W`` (filling bubbles) 45 % long; the GPU presets keep 0.5."""

from __future__ import annotations

import pytest

from entrain.core.plan import ActionKind, Layout
from entrain.core.presets import build_cost_model
from entrain.core.samples import SampleMeta
from entrain.core.schedules.costs import PlanCosts
from entrain.core.work import SampleWork


def _llm_split(cost) -> float:
    """``I / (I + W)`` of a 2-stage LLM's second stage on one 256-token sample."""
    layout = Layout.from_json(
        {"dp": 1, "microbatch_size": 1, "num_microbatches": 1,
         "components": {"encoder": {"tp": 1, "cp": 1, "pp": 1}, "llm": {"tp": 1, "cp": 1, "pp": 2}},
         "stages": [{"stage": 0, "component": "encoder", "layers": [0, 4], "pp_rank": 0},
                    {"stage": 1, "component": "llm", "layers": [0, 2], "pp_rank": 0},
                    {"stage": 2, "component": "llm", "layers": [2, 6], "pp_rank": 1}]}
    )  # fmt: skip
    meta = SampleMeta("s", images=(), text_tokens=256, answer_tokens=64)
    costs = PlanCosts(layout, cost, {"s": SampleWork("s", 0.0, 0.0, meta=meta)})
    i, w = (costs.compute_ms(2, k, ("s",)) for k in (ActionKind.I, ActionKind.W))
    return i / (i + w)


def test_cpu_tiny_input_share_is_the_measured_one():
    assert 0.69 <= _llm_split(build_cost_model("tiny", "cpu-tiny")) <= 0.76


@pytest.mark.parametrize("hardware", ["a40-paper", "a40-flops", "a40-fig4"])
def test_gpu_presets_keep_half(hardware):
    cost = build_cost_model("qwen25vl-llama3-1b", hardware)
    fractions = {layer.bwd_input_fraction for c in (cost.encoder, cost.llm) for layer in c.layers}
    assert fractions == {0.0, 0.5}
