import math

import pytest

from entrain.core.costs.costmodel import ComponentCost, CostModel, HardwareSpec, LayerCost, Quadratic
from entrain.core.workload.samples import SampleMeta


def _layer(name, a=0.0, b=1.0, c=2.0, trainable=True):
    q = {"tp1cp1": Quadratic(a, b, c)}
    qb = {"tp1cp1": Quadratic(2 * a, 2 * b, 2 * c)}
    return LayerCost(
        name, "block", q, qb, activation_bytes_per_token=10.0, output_bytes_per_token=4.0, trainable=trainable
    )


def _model(enc_trainable=True, llm_trainable=True):
    enc = ComponentCost(
        "encoder", (_layer("e0", trainable=enc_trainable), _layer("e1", a=0.01, trainable=enc_trainable))
    )
    llm = ComponentCost("llm", (_layer("l0", trainable=llm_trainable), _layer("l1", trainable=llm_trainable)))
    return CostModel("toy", HardwareSpec("toy"), enc, llm)


def test_layer_time_is_per_unit_quadratic_plus_per_call_constant():
    m = _model()
    # e1: 0.01*x^2 + x per image, + c=2 once per call
    assert m.layer_ms("encoder", 1, [10, 20], "fwd") == pytest.approx(0.01 * 100 + 10 + 0.01 * 400 + 20 + 2)
    assert m.layer_ms("encoder", 1, [10, 20], "fwd", num_calls=3) == pytest.approx(35 + 6)
    assert m.layer_ms("encoder", 1, [10], "bwd", num_calls=0) == pytest.approx(2 * (0.01 * 100 + 10))


def test_sample_work_excludes_constants_and_uses_token_rule():
    m = _model()
    s = SampleMeta("s", ((56, 56),), 6)  # 4 LLM image tokens, 16 ViT patches
    w = m.sample_work(s)
    assert w.encoder == pytest.approx(3 * (16 + 16 + 0.01 * 256))
    assert w.llm == pytest.approx(3 * 2 * (6 + 4))
    assert m.per_call_ms("llm") == pytest.approx(3 * 2 * 2)


def test_frozen_encoder_runs_no_backward_and_frozen_llm_passes_input_grads():
    frozen_enc = _model(enc_trainable=False)
    assert frozen_enc.layer_ms("encoder", 0, [10], "bwd") == 0.0
    # frozen LLM in front of a trainable encoder computes input gradients only (half of bwd)
    frozen_llm = _model(llm_trainable=False)
    full = _model().layer_ms("llm", 1, [10], "bwd")
    assert frozen_llm.layer_ms("llm", 1, [10], "bwd") == pytest.approx(0.5 * full)


def test_missing_parallel_degree_is_a_clear_error():
    with pytest.raises(KeyError, match="tp2cp1"):
        _model().layer_ms("llm", 0, [1], "fwd", tp=2)


def test_json_round_trip(tmp_path):
    m = _model(enc_trainable=False)
    path = tmp_path / "cost.json"
    m.save(str(path))
    again = CostModel.load(str(path))
    assert again == m
    assert math.isclose(again.activation_bytes("encoder", 0, 2, 100), 2000.0)
    assert again.boundary_bytes("llm", 2, 10) == 40.0


def test_load_refuses_a_profile_of_another_model(tmp_path):
    from entrain.core.errors import ConfigError

    path = tmp_path / "cost.json"
    _model().save(str(path))
    assert CostModel.load(str(path), expect_model="toy").model == "toy"
    with pytest.raises(ConfigError, match="profile is for model 'toy' but --model is 'tiny'"):
        CostModel.load(str(path), expect_model="tiny")


def test_a_table_follows_the_power_law_between_its_points():
    """A measured table is read on log-log axes: exact for a pure power (a straight line would put
    x^2 sampled at 1024 and 4096 tokens 50 % too high at 2048), its last segment's power beyond the
    last point (at most quadratic), linear from the per-call constant below the first."""
    square = Quadratic(table=((16.0, 256.0), (1024.0, 1024.0**2), (4096.0, 4096.0**2)))
    for x in (100.0, 2048.0, 3000.0):
        assert square(x) == pytest.approx(x * x)
    assert square(8192.0) == pytest.approx(8192.0**2)
    steep = Quadratic(table=((10.0, 1.0), (20.0, 8.0)))  # x^3 measured: extended at most as x^2
    assert steep(40.0) == pytest.approx(8.0 * 4.0)
    flat = Quadratic(table=((16.0, 1.0), (64.0, 1.0), (256.0, 3.0)))  # a flat segment stays flat
    assert flat(32.0) == pytest.approx(1.0)
    assert flat.constant_ms == pytest.approx(1.0)


def test_kv_projections_fewer_than_tp_ranks_are_counted_whole_on_every_rank():
    """The tiny model's decoder layers have 2 KV heads: TP 2 shards them, TP 4 replicates them (the
    runtime's ``replicate_kv_heads``), so a rank's weights and the planner's model state grow."""
    from entrain.core.costs.memory import MicrobatchLoad, stage_memory_bytes
    from entrain.core.costs.presets import build_cost_model as build

    cost = build("tiny", "cpu-tiny")
    layer = cost.component("llm").layers[1]
    assert (
        layer.kind == "decoder_layer" and layer.kv_heads == 2 and 0 < layer.kv_param_bytes < layer.param_bytes
    )
    assert layer.rank_param_bytes(2) == layer.param_bytes / 2
    kv = layer.kv_param_bytes
    assert layer.rank_param_bytes(4) == (layer.param_bytes - kv) / 4 + kv
    zero = MicrobatchLoad(0.0, 0.0, 0.0, 0.0)
    n = cost.component("llm").num_layers
    grown = stage_memory_bytes(cost, "llm", 1, n - 3, 4, 1, zero, 1) - sum(
        lay.param_bytes * 9.0 / 4 for lay in cost.component("llm").layers[1 : n - 3]
    )
    assert grown == pytest.approx((n - 4) * 9.0 * kv * 3 / 4)
