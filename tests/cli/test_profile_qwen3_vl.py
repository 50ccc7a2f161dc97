"""``entrain profile --model-path`` of whole Qwen3-VL / Qwen3-VL-MoE checkpoints: the reduced profiling
model (one vision block per kind, one decoder layer per kind), the MoE block's measured expert times
in the profile, and the cost model pricing expert tokens with them."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace
from importlib import resources

import jsonschema
import pytest

from entrain.cli.main import main
from entrain.core.costs.costmodel import CostModel, ExpertTiming

TOKENS = "16,64,256"


def _profile(folder, out) -> dict:
    argv = ["profile", "--model-path", str(folder), "--device", "cpu", "--tokens", TOKENS, "--repeats", "1"]
    argv += ["--warmup", "0", "--out", str(out), "--json"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return json.loads(buf.getvalue())


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """(profile path, --json output) of the tiny Qwen3-VL-MoE checkpoint (layer 0 dense, 1-3 sparse)."""
    from tests.models.qwen3_vl_moe_tiny import save_whole

    root = tmp_path_factory.mktemp("moe")
    save_whole(root / "ckpt")
    return root / "profile.json", _profile(root / "ckpt", root / "profile.json")


def test_moe_profile_writes_measured_expert_times(moe):
    out, doc = moe
    schema = json.loads(resources.files("entrain").joinpath("schemas/profile.json").read_text())
    jsonschema.validate(doc, schema)
    cost = CostModel.load(str(out))
    # one dense (layers.0) and one sparse decoder layer (layers.1) timed; the sparse ones share layers.1
    reps = cost.notes["representatives"]["llm"]
    assert [reps[f"layers.{i}"] for i in range(4)] == ["layers.0", "layers.1", "layers.1", "layers.1"]
    layers = cost.llm.layers
    assert layers[1].experts is None  # mlp_only_layers: dense
    assert layers[2].fwd == layers[3].fwd == layers[4].fwd != layers[1].fwd
    timing = ExpertTiming.from_json(doc["experts"])
    for layer in layers[2:5]:
        assert layer.experts is not None and layer.experts.measured == timing
    rows = doc["experts"]["measurements"]
    sizes = [16, 64, 256]
    assert [(r["pattern"], r["tokens"]) for r in rows if r["part"] == "experts"] == [
        (p, x) for p in ("balanced", "concentrated") for x in sizes
    ]
    assert all(r["slots"] == 2 * r["tokens"] for r in rows)  # top-2
    assert {r["experts_hit"] for r in rows if r["pattern"] == "concentrated"} == {2}
    assert {r["experts_hit"] for r in rows if r["pattern"] == "balanced"} == {4}
    assert min(timing.fwd_slot_ms, timing.bwd_slot_ms, timing.fwd_call_ms, timing.bwd_call_ms) >= 0.0


def test_cost_model_prices_expert_tokens_from_the_profile(moe):
    """Planted numbers in the written profile's ``experts.measured`` move ``expert_ms`` exactly: the
    busiest rank's extra tokens at ``top_k * slot_ms`` (a backward phase at its share of the layer's
    backward), not the preset's ``fraction`` of the layer's linear term."""
    out, _ = moe
    doc = json.loads(out.read_text())
    planted = {"fwd": {"slot_ms": 0.01, "call_ms": 0.0, "router_ms_per_token": 0.0},
               "bwd": {"slot_ms": 0.03, "call_ms": 0.0, "router_ms_per_token": 0.0}}  # fmt: skip
    for layer in doc["components"]["llm"]["layers"]:
        if layer.get("experts"):
            layer["experts"]["measured"] = planted
    cost = CostModel.from_json(doc)
    layer = cost.llm.layers[2]
    x = layer.experts
    tokens, ep = 64.0, 2
    extra = tokens * (x.rank_load_factor(tokens, ep) - 1.0)
    no_comm = replace(cost, hardware=replace(cost.hardware, allreduce_latency_ms=0.0,
                                             allreduce_bandwidth_bytes_per_ms=float("inf")))  # fmt: skip
    assert no_comm.expert_ms("llm", 2, tokens, "fwd", ep=ep) == pytest.approx(x.top_k * 0.01 * extra)
    assert no_comm.expert_ms("llm", 2, tokens, "bwd", ep=ep) == pytest.approx(x.top_k * 0.03 * extra)
    # the input-gradient backward: its share of the layer's backward
    q_full, q_in = layer.bwd["tp1cp1"], layer.bwd["tp1cp1"].scaled(layer.bwd_input_fraction)
    share = q_in.b / q_full.b if q_full.b > 0 else 1.0
    assert no_comm.expert_ms("llm", 2, tokens, "bwd_input", ep=ep) == pytest.approx(
        x.top_k * 0.03 * extra * share
    )
    # a stage of the three sparse layers: three times one
    assert no_comm.stage_expert_ms("llm", 2, 5, tokens, "fwd", ep=ep) == pytest.approx(
        3 * x.top_k * 0.01 * extra
    )
    # without the measurement: the preset's fraction of the layer's linear term (another number)
    preset = replace(x, measured=None)
    unmeasured = replace(no_comm, llm=replace(no_comm.llm, layers=tuple(
        replace(la, experts=preset) if la.experts else la for la in no_comm.llm.layers)))  # fmt: skip
    fwd_b = layer.fwd["tp1cp1"].b
    assert unmeasured.expert_ms("llm", 2, tokens, "fwd", ep=ep) == pytest.approx(x.fraction * fwd_b * extra)
    assert x.fraction * fwd_b != pytest.approx(x.top_k * 0.01)
    # the measurement survives a save / load
    assert CostModel.from_json(cost.to_json()).llm.layers[2].experts.measured == x.measured


def test_dense_qwen3_vl_profiles_on_a_reduced_model(tmp_path):
    """The dense family: one untapped and one DeepStack-tapped vision block, one decoder layer."""
    from tests.models.qwen3_vl_tiny import TAPS, save_whole

    save_whole(tmp_path / "ckpt")
    doc = _profile(tmp_path / "ckpt", tmp_path / "profile.json")
    assert "experts" not in doc
    cost = CostModel.load(str(tmp_path / "profile.json"))
    reps = cost.notes["representatives"]
    blocks = [n for n in cost.encoder.layer_names if n.startswith("blocks.")]
    tapped = {f"blocks.{i}" for i in TAPS}
    assert {reps["encoder"][n] for n in blocks if n in tapped} == {"blocks.0"}  # block 0 is tapped
    assert {reps["encoder"][n] for n in blocks if n not in tapped} == {"blocks.1"}
    assert {reps["llm"][n] for n in cost.llm.layer_names if n.startswith("layers.")} == {"layers.0"}
    # patch_embed, 2 blocks, merger; embed_tokens, 1 decoder layer, norm, lm_head, loss
    assert len(doc["fits"]) == 2 * (4 + 5)
