"""The ``qwen3vl-8b`` cost-model preset: Qwen3-VL-8B-Instruct's published shape, its parameter count,
and DeepStack's extra message bytes at every cut they cross; ``plan --model qwen3vl-8b`` cuts the
tower and LLM anywhere (no forbidden cut)."""

from __future__ import annotations

import pytest

from entrain.core.costs.presets import build_cost_model
from entrain.models.families.qwen3_vl.presets import QWEN3_VL_8B

H, MERGE = 4096, 4  # LLM width = merger output; patches per merged token


def test_the_preset_has_the_published_parameter_count():
    """8.77 B (the model card's "8.77B parameters"): tower incl. position table and 3 DeepStack
    mergers, Qwen3 decoder incl. q/k norms, untied lm_head."""
    assert QWEN3_VL_8B.num_params() == pytest.approx(8.767e9, rel=1e-3)
    assert QWEN3_VL_8B.deepstack == (8, 16, 24)


@pytest.mark.parametrize(
    ("component", "layer", "parts"),
    [
        ("encoder", 9, 0),  # up to blocks.7: no tap made yet
        ("encoder", 10, 1),  # after blocks.8 (tap 0)
        ("encoder", 26, 3),  # after blocks.24: all three taps ride to the LLM
        ("encoder", 29, 3),  # the merger: the encoder -> LLM message
        ("llm", 1, 3),  # after embed_tokens: no decoder layer has added one yet
        ("llm", 2, 2),  # after layers.0 (adds deepstack_0)
        ("llm", 3, 1),
        ("llm", 4, 0),  # after layers.2 every feature is added
    ],
)
def test_deepstack_parts_are_priced_at_every_cut_they_cross(component, layer, parts):
    cost = build_cost_model(QWEN3_VL_8B, "a40-flops")
    tokens, image_tokens = 4096.0, 1000.0
    hidden = tokens * cost.component(component).layers[layer - 1].output_bytes_per_token
    rows = tokens / MERGE if component == "encoder" else image_tokens
    extra = cost.boundary_bytes(component, layer, tokens, image_tokens) - hidden
    assert extra == pytest.approx(parts * rows * H * 2)
    assert not cost.forbidden_cuts(component)
