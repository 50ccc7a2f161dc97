"""The ``qwen3vl-30b-a3b`` cost-model preset: Qwen3-VL-30B-A3B-Instruct's published shape, its total
and activated parameter counts (every expert held, the router and 8 experts computed per token), and
the ``router_stats`` part only where the auxiliary loss is on."""

from __future__ import annotations

import pytest

from entrain.core.costs.presets import build_cost_model
from entrain.models.families.qwen3_vl_moe.presets import QWEN3_VL_30B_A3B, QWEN3_VL_30B_A3B_CONFIG
from entrain.models.families.qwen3_vl_moe.spec import ROUTER_STATS, shape_of_config

H, E, TOP_K, WIDTH, LAYERS, VOCAB = 2048, 128, 8, 768, 48, 151936


def test_the_preset_has_the_published_parameter_counts():
    """31.07 B held (the Hub's "31.1B params": tower, DeepStack mergers, 48 layers of 128 experts,
    untied lm_head); 3.3 B activated per token (Qwen3-30B-A3B's "3.3B activated": attention, router
    and 8 experts of each layer, embedding and lm_head)."""
    shape = QWEN3_VL_30B_A3B
    assert shape.num_params() == pytest.approx(31.07e9, rel=1e-3)
    assert shape.sparse == tuple(range(LAYERS)) and (shape.num_experts, shape.top_k) == (E, TOP_K)
    llm = shape.layer_specs()["llm"]
    decoder = [s for s in llm if s.kind == "decoder_layer"]
    active = sum(s.lin_flops for s in decoder) / 2 + 2 * VOCAB * H
    assert active == pytest.approx(3.3e9, rel=2e-2)


def test_a_sparse_layer_computes_router_and_top_k_experts_and_holds_every_expert():
    """Against the same decoder with a dense MLP of the experts' total width: the FLOPs of a sparse
    layer are the attention's, the router's and ``top_k`` experts'; its parameters every expert's."""
    sparse = QWEN3_VL_30B_A3B.layer_specs()["llm"][1]
    text = {**QWEN3_VL_30B_A3B_CONFIG["text_config"], "mlp_only_layers": list(range(LAYERS))}
    dense = shape_of_config({**QWEN3_VL_30B_A3B_CONFIG, "text_config": text}, "test", "t").layer_specs()[
        "llm"
    ][1]
    mlp = 3 * H * 6144  # the dense MLP (intermediate_size 6144)
    assert sparse.lin_flops - dense.lin_flops == 2.0 * H * E + TOP_K * 2.0 * 3 * H * WIDTH - 2.0 * mlp
    assert sparse.param_count - dense.param_count == E * H + E * 3 * H * WIDTH - mlp
    assert sparse.attn_lin_flops == dense.attn_lin_flops


@pytest.mark.parametrize("aux", [False, True])
def test_router_stats_cross_llm_cuts_only_with_the_auxiliary_loss(aux):
    """The published checkpoint leaves ``output_router_logits`` off: no part. On, ``router_stats``
    crosses every LLM cut from after the first sparse layer to the lm_head, priced as zero bytes."""
    text = {**QWEN3_VL_30B_A3B_CONFIG["text_config"], "output_router_logits": aux}
    shape = shape_of_config({**QWEN3_VL_30B_A3B_CONFIG, "text_config": text}, "test", "t")
    cost = build_cost_model(shape, "a40-flops")
    n = len(cost.component("llm").layers)
    carried = [j for j in range(1, n + 1) if ROUTER_STATS in {p.name for p in cost.boundary_parts("llm", j)}]
    assert carried == (list(range(2, n)) if aux else [])  # up to the cut after lm_head (n - 1)
    hidden = 4096.0 * cost.component("llm").layers[9].output_bytes_per_token
    assert cost.boundary_bytes("llm", 10, 4096.0, 0.0) == pytest.approx(hidden)
