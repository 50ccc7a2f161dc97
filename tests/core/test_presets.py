"""Architecture numbers and cost-model presets."""

import dataclasses

import pytest

from entrain.core.errors import ConfigError
from entrain.core.model.architectures import MODEL_PRESETS, QWEN2_VOCAB_SIZE, get_arch

# sum(p.numel()) of the transformers 5.24.0 modules built from these configs (measured once, meta device).
HF_PARAM_COUNTS = {
    "tiny": (809_472, 1_344_128),
    "qwen25vl-llama3-1b": (668_684_288, 1_284_311_040),
    "qwen25vl-llama3-3b": (673_928_192, 3_285_494_784),
    # full attention everywhere changes no parameter
    "qwen25vl-fullatt-llama3-1b": (668_684_288, 1_284_311_040),
}


@pytest.mark.parametrize("name", sorted(HF_PARAM_COUNTS))
def test_param_counts_match_transformers(name):
    arch = get_arch(name)
    assert (arch.vision.num_params(), arch.llm.num_params()) == HF_PARAM_COUNTS[name]


def test_published_sizes():
    """675M vision tower (Qwen2.5-VL, merger to 3584), Llama-3.2 1.24B / 3.21B with their own 128,256 vocab."""
    vit = dataclasses.replace(get_arch("qwen25vl-llama3-1b").vision, out_hidden_size=3584)
    assert vit.num_params() == pytest.approx(675e6, rel=0.005)
    llm1 = dataclasses.replace(get_arch("qwen25vl-llama3-1b").llm, vocab_size=128_256)
    llm3 = dataclasses.replace(get_arch("qwen25vl-llama3-3b").llm, vocab_size=128_256)
    assert llm1.num_params() == pytest.approx(1.236e9, rel=0.002)
    assert llm3.num_params() == pytest.approx(3.213e9, rel=0.002)


def test_arch_facts():
    a = get_arch("qwen25vl-llama3-1b")
    assert a.vision.window_patches == 64 and a.vision.patch_dim == 1176 and a.vision.merge_factor == 4
    assert a.vision.fullatt_block_indexes == (7, 15, 23, 31)
    assert a.llm.vocab_size == QWEN2_VOCAB_SIZE and a.llm.head_dim == 64 and a.llm.tie_word_embeddings
    assert get_arch("qwen25vl-llama3-3b").llm.head_dim == 128
    t = get_arch("tiny")
    assert t.llm.vocab_size <= 4096 and not t.llm.tie_word_embeddings
    assert t.vision.hf_kwargs()["fullatt_block_indexes"] == [1]
    assert set(MODEL_PRESETS) == {
        "tiny",
        "qwen25vl-llama3-1b",
        "qwen25vl-llama3-3b",
        "qwen25vl-fullatt-llama3-1b",
    }
    full = get_arch("qwen25vl-fullatt-llama3-1b")
    assert full.vision.fullatt_block_indexes == tuple(range(32)) and full.llm == a.llm
    assert dataclasses.replace(full.vision, fullatt_block_indexes=(7, 15, 23, 31)) == a.vision


@pytest.mark.parametrize("field", ["norm", "mlp"])
def test_vision_properties_are_checked(field):
    """The tower's norm and MLP kinds are properties, not a family name: a bad kind names the field."""
    with pytest.raises(ConfigError, match=f"vision {field} 'other'"):
        dataclasses.replace(get_arch("tiny").vision, **{field: "other"})


def test_unknown_arch():
    with pytest.raises(ConfigError, match="unknown model preset"):
        get_arch("gpt5")


# --- cost presets ---------------------------------------------------------------------------------
from entrain.core.costs.costmodel import CostModel, parallel_key  # noqa: E402
from entrain.core.costs.presets import HARDWARE_PRESETS, build_cost_model  # noqa: E402
from entrain.core.workload.samples import SampleMeta  # noqa: E402

SAMPLE = SampleMeta("s", ((576, 768),), 162)


@pytest.mark.parametrize("hardware", HARDWARE_PRESETS)
@pytest.mark.parametrize("model", sorted(MODEL_PRESETS))
def test_every_model_on_every_hardware(model, hardware):
    cost = build_cost_model(model, hardware)
    arch = get_arch(model)
    assert cost.encoder.num_layers == arch.vision.depth + 2  # patch_embed, blocks, merger
    assert cost.llm.num_layers == arch.llm.num_hidden_layers + 4  # embed, layers, norm, lm_head, loss
    assert cost.encoder.layer_names[0] == "patch_embed" and cost.encoder.layer_names[-1] == "merger"
    assert cost.llm.layer_names[-3:] == ["norm", "lm_head", "loss"]
    for layer in cost.encoder.layers + cost.llm.layers:
        assert {"tp1cp1", "tp1cp2", "tp2cp1"} <= set(layer.fwd) and set(layer.fwd) == set(layer.bwd)
    work = cost.sample_work(SAMPLE)
    assert work.encoder > 0 and work.llm > 0
    assert CostModel.from_json(cost.to_json()) == cost
    # parameter bytes are bf16 of the architecture's parameters
    assert sum(x.param_bytes for x in cost.encoder.layers) == 2 * arch.vision.num_params()
    assert sum(x.param_bytes for x in cost.llm.layers) == 2 * arch.llm.num_params()


def test_lm_head_costs_about_four_decoder_layers_at_all_tokens():
    cost = build_cost_model("qwen25vl-llama3-1b", "a40-flops", label_fraction=1.0)
    names = cost.llm.layer_names
    head = cost.llm.layers[names.index("lm_head")].fwd["tp1cp1"].b
    layer = cost.llm.layers[names.index("layers.0")].fwd["tp1cp1"].b
    assert 4.0 <= head / layer <= 5.5
    # by default the head is priced per label token: a sample's answer tokens where its data says,
    # else LABEL_FRACTION (0.2) of its LLM tokens
    cost_default = build_cost_model("qwen25vl-llama3-1b", "a40-flops")
    i = names.index("lm_head")
    assert cost_default.llm.layers[i].per_label and not cost.llm.layers[i].per_label
    assert cost_default.llm.layers[i].fwd["tp1cp1"].b == pytest.approx(head)
    unknown = SampleMeta("s", (), 1000)
    answered = SampleMeta("s", (), 1000, answer_tokens=700)

    def head_ms(c, s):
        return c.layer_ms("llm", i, c.units("llm", s), "fwd", labels=c.labels("llm", s), num_calls=0)

    assert head_ms(cost_default, unknown) == pytest.approx(head_ms(cost, unknown) * 0.2)
    assert head_ms(cost_default, answered) == pytest.approx(head_ms(cost, unknown) * 0.7)


def test_window_vs_full_attention_blocks():
    cost = build_cost_model("qwen25vl-llama3-1b", "a40-flops")
    by_name = {x.name: x for x in cost.encoder.layers}
    assert by_name["blocks.0"].fwd["tp1cp1"].a == 0.0 and by_name["blocks.0"].kind == "vit_block_window"
    for b in (7, 15, 23, 31):
        assert by_name[f"blocks.{b}"].fwd["tp1cp1"].a > 0 and by_name[f"blocks.{b}"].kind == "vit_block_full"


def test_backward_costs_more_and_tp_shards():
    cost = build_cost_model("qwen25vl-llama3-3b", "a40-flops")
    layer = cost.llm.layers[1]
    f1, b1 = layer.fwd[parallel_key(1, 1)], layer.bwd[parallel_key(1, 1)]
    assert b1.b == pytest.approx(2 * f1.b) and b1.a == pytest.approx(2.5 * f1.a)
    f2 = layer.fwd[parallel_key(2, 1)]
    assert f1.b / 2 < f2.b < f1.b  # half the FLOPs plus the all-reduces
    assert cost.activation_bytes("llm", 1, 2, 1000, tp=2) == pytest.approx(
        cost.activation_bytes("llm", 1, 2, 1000) / 2
    )


def test_cpu_tiny_matches_measured_scale():
    """The analytic base (before the traced corrections) is the reference measurements' scale."""
    cost = P.analytic_cpu_tiny("tiny")
    assert cost.per_call_ms("encoder") == pytest.approx(14.0)
    assert cost.per_call_ms("llm") == pytest.approx(14.0)
    # one square image of 1024 patches: 157.7 ms measured (F+B incl. the constant)
    img = SampleMeta("i", ((448, 448),), 1)
    assert img.vit_patches == 1024
    enc = cost.sample_work(img).encoder + cost.per_call_ms("encoder")
    assert 157.7 * 0.8 < enc < 157.7 * 1.25


def test_cpu_tiny_carries_the_traced_fit():
    """``cpu-tiny`` = the analytic base with ``benchmarks/results/cpu_tiny_fit.json``'s per-kind scales
    (the fit's record and the preset's constants are one set of numbers)."""
    import json
    import pathlib

    fit = json.loads((pathlib.Path(__file__).parents[2] / "benchmarks/results/cpu_tiny_fit.json").read_text())
    assert fit["kind_scales"] == P.CPU_TINY_KIND_SCALES
    assert fit["action_overhead_ms"] == P.CPU_TINY_ACTION_OVERHEAD_MS
    cost, base = build_cost_model("tiny", "cpu-tiny"), P.analytic_cpu_tiny("tiny")
    assert cost.hardware.action_overhead_ms == P.CPU_TINY_ACTION_OVERHEAD_MS
    for new, old in zip((*cost.encoder.layers, *cost.llm.layers), (*base.encoder.layers, *base.llm.layers)):
        s = P.CPU_TINY_KIND_SCALES[P.fitted_kind(new.kind)]
        assert new.fwd["tp1cp1"].b == pytest.approx(old.fwd["tp1cp1"].b * s["fwd"])
        assert new.bwd["tp1cp1"].c == pytest.approx(old.bwd["tp1cp1"].c * s["bwd_const"])
        assert new.split_extra_fraction == s["split_extra_fraction"]


def test_frozen_components():
    full = build_cost_model("qwen25vl-llama3-1b", "a40-paper")
    frozen_enc = build_cost_model("qwen25vl-llama3-1b", "a40-paper", freeze=("encoder",))
    assert not any(x.trainable for x in frozen_enc.encoder.layers)
    n = frozen_enc.encoder.num_layers
    assert frozen_enc.stage_ms("encoder", 0, n, (1000,), "bwd") == 0.0  # frozen tower runs no backward
    vit = build_cost_model("qwen25vl-llama3-1b", "a40-paper", freeze=("vit",))
    assert [x.trainable for x in vit.encoder.layers] == [False] * (n - 1) + [True]
    merger_bwd = vit.layer_ms("encoder", n - 1, (1000,), "bwd", num_calls=0)
    assert merger_bwd == pytest.approx(0.5 * full.layer_ms("encoder", n - 1, (1000,), "bwd", num_calls=0))
    assert vit.stage_ms("encoder", 0, n - 1, (1000,), "bwd") == 0.0
    frozen_llm = build_cost_model("qwen25vl-llama3-1b", "a40-paper", freeze=("llm",))
    # LLM computes input gradients only (the encoder trains)
    x = (800,)
    assert frozen_llm.stage_ms("llm", 1, 2, x, "bwd", num_calls=0) == pytest.approx(
        0.5 * full.stage_ms("llm", 1, 2, x, "bwd", num_calls=0)
    )
    with pytest.raises(ConfigError, match="unknown freeze"):
        build_cost_model("tiny", "cpu-tiny", freeze=("decoder",))


def test_unknown_hardware():
    with pytest.raises(ConfigError, match="unknown hardware preset"):
        build_cost_model("tiny", "h100")


# --- eager attention ---------------------------------------------------------------------------------
from entrain.core.costs import presets as P  # noqa: E402
from entrain.core.costs.presets import attention_by_component  # noqa: E402


def _layer(cost, comp, name):
    return next(layer for layer in cost.component(comp).layers if layer.name == name)


def test_eager_attention_prices_the_materialised_scores():
    """Eager - flash, per layer and per unit: the op-counted score traffic at the preset's memory rate,
    the causal LLM's masked half of the score FLOPs, no flash recomputation, and 6 saved bytes per
    score per head; window blocks pay the same per score, linearly (64 scores per patch)."""
    flash = build_cost_model("qwen25vl-llama3-1b", "a40-flops", attention="flash")
    eager = build_cost_model("qwen25vl-llama3-1b", "a40-flops", attention="eager")
    rate = P.A40_MEMORY_BYTES_PER_MS * P.A40_FLOPS_EFFICIENCY
    flops = P.A40_PEAK_BF16_FLOPS_PER_MS * P.A40_FLOPS_EFFICIENCY
    heads, h = 16, 1280
    f, e = _layer(flash, "encoder", "blocks.7"), _layer(eager, "encoder", "blocks.7")  # full attention
    assert e.fwd["tp1cp1"].a - f.fwd["tp1cp1"].a == pytest.approx(heads * 20.0 / rate)
    assert e.bwd["tp1cp1"].a == pytest.approx(2.0 * 4.0 * h / flops + heads * 36.0 / rate)
    assert e.fwd["tp1cp1"].b == f.fwd["tp1cp1"].b
    assert e.activation_bytes_per_token_sq == heads * 6.0 and f.activation_bytes_per_token_sq == 0.0
    assert e.fwd["tp2cp1"].a == pytest.approx(e.fwd["tp1cp1"].a / 2)  # heads split over TP
    f, e = _layer(flash, "encoder", "blocks.0"), _layer(eager, "encoder", "blocks.0")  # 64-patch windows
    assert e.fwd["tp1cp1"].b - f.fwd["tp1cp1"].b == pytest.approx(heads * 64 * 20.0 / rate)
    assert e.activation_bytes_per_token - f.activation_bytes_per_token == heads * 64 * 6.0
    assert e.fwd["tp1cp1"].a == f.fwd["tp1cp1"].a == 0.0
    f, e = _layer(flash, "llm", "layers.0"), _layer(eager, "llm", "layers.0")  # causal, masked
    q = 2048
    assert f.fwd["tp1cp1"].a == pytest.approx(2.0 * q / flops)
    assert e.fwd["tp1cp1"].a == pytest.approx(4.0 * q / flops + 32 * 26.0 / rate)
    for name in ("patch_embed", "merger"):
        assert _layer(eager, "encoder", name) == _layer(flash, "encoder", name)
    again = CostModel.from_json(eager.to_json())
    assert again == eager
    assert again.activation_bytes("encoder", 8, 9, 100, tokens_sq=100 * 100) == pytest.approx(
        100 * e_act(eager) + 1e4 * heads * 6.0
    )


def e_act(cost):
    return _layer(cost, "encoder", "blocks.7").activation_bytes_per_token


def test_attention_spec_per_component_and_preset_default():
    assert attention_by_component("eager") == {"encoder": "eager", "llm": "eager"}
    assert attention_by_component("encoder=eager") == {"encoder": "eager", "llm": "flash"}
    for bad in ("sdpa", "encoder=slow", "vision=eager", "encoder"):
        with pytest.raises(ConfigError, match="attention"):
            attention_by_component(bad)
    fig4 = build_cost_model("qwen25vl-fullatt-llama3-1b", "a40-fig4")
    assert fig4.notes["attention"] == {"encoder": "eager", "llm": "flash"}
    assert fig4.notes["fit"] == "benchmarks/fit_a40_fig4.py"
    flash = build_cost_model("qwen25vl-fullatt-llama3-1b", "a40-fig4", attention="flash")
    assert flash.llm == fig4.llm and flash.encoder != fig4.encoder
    assert build_cost_model("qwen25vl-llama3-1b", "a40-flops").notes["attention"]["encoder"] == "flash"


def test_fig4_setup_is_quadratic_dominated_and_the_evaluation_setup_is_not():
    """Per-sample encoder:LLM ratio of a 1,564-patch COCO image vs an 8,112-patch chart (paper Fig. 4:
    ~3.5 vs ~22) for an 8,064-patch chart: the full-attention eager tower's ratio grows >4x; the
    evaluation tower's (window attention, flash) barely."""
    coco = SampleMeta("coco", ((476, 644),), 60)
    chart = SampleMeta("chart", ((1344, 1176),), 100)
    assert (coco.vit_patches, chart.vit_patches) == (1564, 8064)

    def ratio(cost, s):
        w = cost.sample_work(s)
        return w.encoder / w.llm

    fig4 = build_cost_model("qwen25vl-fullatt-llama3-1b", "a40-fig4")
    paper = build_cost_model("qwen25vl-llama3-1b", "a40-paper")
    assert ratio(fig4, chart) / ratio(fig4, coco) > 4.0
    assert ratio(paper, chart) / ratio(paper, coco) < 1.5
