"""Profile fitting: NNLS quadratic, fit quality, the monotone piecewise-linear table and how the cost
model prices with it, and the representative-layer map of the paper-size presets."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from entrain.core.costs.costmodel import ComponentCost, CostModel, HardwareSpec, LayerCost, Quadratic
from entrain.core.errors import ConfigError
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.profiling import image_grid
from entrain.runtime.profiler import (
    MAX_REL_RESIDUAL,
    fit_curve,
    fit_quadratic,
    fit_quality,
    monotone_table,
    representative_config,
)

XS = [16, 64, 256, 1024]


def test_fit_recovers_a_quadratic_and_stays_non_negative():
    q = fit_quadratic(XS, [2e-5 * x * x + 0.1 * x + 3.0 for x in XS])
    assert q.a == pytest.approx(2e-5, rel=1e-6) and q.b == pytest.approx(0.1, rel=1e-6)
    assert q.c == pytest.approx(3.0, rel=1e-6)
    q = fit_quadratic(XS, [5.0 - 0.001 * x for x in XS])  # decreasing data: no negative coefficients
    assert min(q.a, q.b, q.c) >= 0


def test_two_sizes_fit_a_line():
    q = fit_quadratic([64, 256], [1.0 + 0.01 * 64, 1.0 + 0.01 * 256])
    assert q.a == 0 and q.b == pytest.approx(0.01) and q.c == pytest.approx(1.0)


def test_fit_quality_of_an_exact_and_a_bad_fit():
    ms = [2e-5 * x * x + 0.1 * x + 3.0 for x in XS]
    good = fit_quality(fit_quadratic(XS, ms), XS, ms)
    assert good.r2 == pytest.approx(1.0) and good.worst_rel_residual < 1e-6
    bad = fit_quality(lambda x: 1.0, XS, ms)
    assert bad.r2 < 0 and bad.worst_rel_residual == pytest.approx(1 - 1 / ms[-1])


def test_a_well_fitting_quadratic_gets_no_table():
    curve, quality, used = fit_curve(XS, [0.5 * x + 3.0 for x in XS])
    assert curve.table == () and quality == used and quality.worst_rel_residual <= MAX_REL_RESIDUAL


def test_a_step_gets_a_monotone_table_that_fits_better():
    ms = [1.0, 1.0, 10.0, 10.5]  # a step no quadratic with a, b, c >= 0 follows within 20 %
    curve, quality, used = fit_curve(XS, ms)
    assert quality.worst_rel_residual > MAX_REL_RESIDUAL
    assert curve.table and used.worst_rel_residual < quality.worst_rel_residual
    assert [x for x, _ in curve.table] == XS
    assert curve(64) == pytest.approx(1.0) and curve(1024) == pytest.approx(10.5)


@given(st.lists(st.floats(0.01, 100.0), min_size=2, max_size=6))
def test_monotone_table_is_non_decreasing(ms):
    xs = [8 * 2**i for i in range(len(ms))]
    table = monotone_table(xs, ms)
    values = [v for _, v in table]
    assert [x for x, _ in table] == xs
    assert all(b >= a for a, b in zip(values, values[1:])) and min(values) >= 0
    q = Quadratic(table=table)  # accepted by the cost model's validation
    assert q(xs[0]) == pytest.approx(values[0]) and q(xs[-1]) == pytest.approx(values[-1])


def test_table_interpolates_extrapolates_and_splits_the_per_call_constant():
    q = Quadratic(9.0, 9.0, 9.0, table=((10.0, 2.0), (20.0, 3.0), (40.0, 7.0)))
    assert q.constant_ms == pytest.approx(1.0)  # the first segment at x = 0
    assert q(0) == pytest.approx(1.0) and q(5) == pytest.approx(1.5)
    # between points and beyond the last one: the power law through the last segment, 3 * (x / 20)^k
    k = math.log(7.0 / 3.0) / math.log(2.0)
    assert q(30) == pytest.approx(3.0 * 1.5**k) and q(60) == pytest.approx(7.0 * 1.5**k)
    assert q.variable_ms(30) == pytest.approx(3.0 * 1.5**k - 1.0)
    assert Quadratic.from_json(q.to_json()) == q
    assert q.scaled(0.5)(30) == pytest.approx(1.5 * 1.5**k)
    assert "table" not in Quadratic(1, 2, 3).to_json()  # the analytic presets' JSON is unchanged


@pytest.mark.parametrize(
    "table", [((0.0, 1.0), (2.0, 2.0)), ((4.0, 1.0), (2.0, 2.0)), ((2.0, 3.0), (4.0, 2.0))]
)
def test_bad_tables_are_refused(table):
    with pytest.raises(ConfigError, match="cost table"):
        Quadratic(table=table)


def _cost(curve: Quadratic, trainable: bool = True) -> CostModel:
    layer = LayerCost("l0", "decoder_layer", {"tp1cp1": curve}, {"tp1cp1": curve}, trainable=trainable)
    embed = LayerCost("e", "embedding", {"tp1cp1": Quadratic()}, {"tp1cp1": Quadratic()})
    return CostModel(
        "m",
        HardwareSpec("h"),
        ComponentCost("encoder", (layer,)),
        ComponentCost("llm", (embed, layer)),
    )


def test_layer_ms_prices_units_with_the_table_and_round_trips():
    curve = Quadratic(table=((10.0, 2.0), (20.0, 3.0)))
    cost = _cost(curve)
    # two units of 20 in one call: 2 x variable (2.0) + one constant (1.0)
    assert cost.layer_ms("llm", 1, [20, 20], "fwd") == pytest.approx(5.0)
    assert cost.layer_ms("llm", 1, [20, 20], "fwd", num_calls=0) == pytest.approx(4.0)
    at_15 = 2.0 * 1.5 ** (math.log(1.5) / math.log(2.0))  # the power law through (10, 2) and (20, 3)
    assert CostModel.from_json(cost.to_json()).layer_ms("llm", 1, [15], "bwd") == pytest.approx(at_15)
    frozen = _cost(curve, trainable=False)  # input gradients only: bwd_input_fraction of the table
    assert frozen.layer_ms("llm", 1, [20], "bwd") == pytest.approx(1.5)


def test_representatives_of_the_1b_preset():
    cfg = get_model_config("qwen25vl-llama3-1b")
    small, rep = representative_config(cfg)
    assert small.llm.num_hidden_layers == 1 and small.vision.depth == 2
    assert small.name == cfg.name
    enc, llm = rep["encoder"], rep["llm"]
    assert sorted(enc) == list(range(len(cfg.encoder_layer_names)))
    assert sorted(llm) == list(range(len(cfg.llm_layer_names)))
    for block in range(cfg.vision.depth):  # each block maps to the small block of its attention kind
        small_block = enc[block + 1] - 1
        assert small.vision.is_full_attention(small_block) == cfg.vision.is_full_attention(block)
    assert enc[0] == 0 and enc[cfg.vision.depth + 1] == 3
    n = cfg.llm.num_hidden_layers
    assert [llm[0], llm[1], llm[n], llm[n + 1], llm[n + 2], llm[n + 3]] == [0, 1, 1, 2, 3, 4]


def test_image_grid_has_mergeable_sides():
    for n in (16, 64, 100, 256, 1000, 4096):
        t, h, w = image_grid(n)
        assert t == 1 and h % 2 == 0 and w % 2 == 0 and abs(h * w - n) <= max(8, 0.25 * n)


def test_label_layers_are_timed_on_x_label_tokens():
    """``lm_head`` and the loss (``per_label``) get ``x`` labelled positions, other LLM layers
    ``LABEL_FRACTION`` of ``x``: their curves are per label token, as the cost model reads them."""
    import torch

    from entrain.runtime.profiler import _llm_input, timing_model

    cfg = get_model_config("tiny")
    model = timing_model(representative_config(cfg)[0])
    loss = model.cfg.llm_layer_names.index("loss")
    (inp, batch), units = _llm_input(model, loss, 64, torch.device("cpu"), per_label=True)
    assert units == 64 and inp.shape[0] == 64 and len(batch.label_positions) == 64
    (inp, batch), _ = _llm_input(model, loss, 64, torch.device("cpu"))
    assert len(batch.label_positions) == 13 == inp.shape[0]


def test_timed_passes_interleave_across_layers_and_sizes(monkeypatch):
    """Every (layer, size) is warmed up first, then timed once per round in turn, so a slow spell of
    the machine spreads over all of them (not back-to-back repeats of one)."""
    import torch

    from entrain.runtime import profiler

    calls = []

    def fake_time_once(run_fwd, device):
        out = run_fwd()
        calls.append(tuple(out.shape))
        return 1.0, 2.0

    monkeypatch.setattr(profiler, "_time_once", fake_time_once)
    model = profiler.timing_model(representative_config(get_model_config("tiny"))[0])
    entries = [profiler._Entry("llm", 1, x, False) for x in (16, 32)]
    timed = profiler._measure_rounds(model, entries, torch.device("cpu"), repeats=3, warmup=1)
    assert calls == [(1, 16, 128), (1, 32, 128)] * 4  # warm-up round, then 3 timed rounds
    assert timed[entries[1]] == (32, 1.0, 2.0)


def test_the_median_of_profiles_takes_per_size_medians_and_refits():
    """``median_profile``: of one profile, that profile; of three, the per-size median of their
    measurements, fitted again, on every layer the representative stands for."""
    from dataclasses import replace as dc_replace

    from entrain.core.costs.presets import build_cost_model
    from entrain.runtime.profiler import median_profile

    fits = []
    for comp, names in (("encoder", ["patch_embed", "blocks.0", "blocks.1", "merger"]),
                        ("llm", ["embed_tokens", "layers.0", "norm", "lm_head", "loss"])):  # fmt: skip
        for name in names:
            for phase in ("fwd", "bwd"):
                fits.append({"component": comp, "layer": name, "kind": "k", "phase": phase,
                             "tokens": [16, 64, 256], "ms": [1.0, 2.0, 5.0]})  # fmt: skip
    base = build_cost_model("tiny", "cpu-tiny")
    reps = {c: {n: n if not n.startswith("layers.") else "layers.0" for n in base.component(c).layer_names}
            for c in ("encoder", "llm")}  # fmt: skip
    reps["encoder"].update({"blocks.2": "blocks.0", "blocks.3": "blocks.1"})

    def profile(scale):
        scaled = [{**f, "ms": [m * scale for m in f["ms"]]} for f in fits]
        return dc_replace(base, notes={"fits": scaled, "representatives": reps})

    one, _ = median_profile([profile(1.0)])
    merged, out = median_profile([profile(1.0), profile(3.0), profile(2.0)])
    assert [f.ms for f in out] == [(2.0, 4.0, 10.0)] * len(fits)
    last = merged.llm.layers[merged.llm.layer_names.index("layers.1")].fwd["tp1cp1"]
    assert last(64) == pytest.approx(2 * one.llm.layers[1].fwd["tp1cp1"](64), rel=1e-6)
    with pytest.raises(ValueError, match="other sizes"):
        bad = profile(1.0)
        bad.notes["fits"][0]["tokens"] = [1, 2, 3]
        median_profile([profile(1.0), bad])


def _expert_rows(scale: float) -> list[dict]:
    """``measure_experts``' rows of a 4-expert, top-2 block: ``scale`` times 0.2 ms per expert called
    and 0.01 ms per routed slot (the backward twice that), the router 0.001 ms per token (0.002)."""
    rows = []
    for x in (16, 64):
        rows.append({"part": "router", "pattern": None, "tokens": x, "slots": 2 * x, "experts_hit": 0,
                     "fwd_ms": scale * 0.001 * x, "bwd_ms": scale * 0.002 * x})  # fmt: skip
        for pattern, hit in (("balanced", 4), ("concentrated", 2)):
            ms = scale * (0.2 * hit + 0.01 * 2 * x)
            rows.append({"part": "experts", "pattern": pattern, "tokens": x, "slots": 2 * x,
                         "experts_hit": hit, "fwd_ms": ms, "bwd_ms": 2 * ms})  # fmt: skip
    return rows


def test_the_median_of_moe_profiles_merges_their_expert_timings():
    """``median_profile`` of mixture-of-experts profiles: the sparse block's measurements
    (``notes["experts"]``) are merged as the layers' are (per measurement the median over the
    profiles, fitted again), and every sparse layer prices its experts with that fit, not with the
    first profile's; profiles of which only some timed the experts are refused."""
    from dataclasses import replace as dc_replace

    from entrain.core.costs.costmodel import PROFILE_SOURCE, ExpertCost
    from entrain.runtime.profile_experts import fit_timing, with_expert_timing
    from entrain.runtime.profiler import median_profile

    q = Quadratic(0.0, 0.01, 0.1)
    x = ExpertCost(4, 2, 0.5, 0.0, 800.0)

    def layer(name, experts=None):
        return LayerCost(name, "decoder_layer", {"tp1cp1": q}, {"tp1cp1": q.scaled(2.0)}, experts=experts)

    names = {"encoder": ["blocks.0"], "llm": ["embed_tokens", "layers.0", "layers.1"]}
    base = CostModel(
        "hand",
        HardwareSpec("hand"),
        ComponentCost("encoder", (layer("blocks.0"),)),
        ComponentCost("llm", (layer("embed_tokens"), layer("layers.0", x), layer("layers.1", x))),
    )
    fits = [{"component": c, "layer": n, "kind": "k", "phase": p, "tokens": [16, 64, 256], "ms": [1.0, 2.0, 5.0]}
            for c, ns in names.items() for n in ns for p in ("fwd", "bwd")]  # fmt: skip
    reps = {c: {n: n for n in ns} for c, ns in names.items()}

    def profile(scale, timed=True):
        timing = fit_timing(_expert_rows(scale))
        notes = {"source": PROFILE_SOURCE, "fits": fits, "representatives": reps}
        if timed:
            notes["experts"] = {**timing.to_json(), "measurements": _expert_rows(scale)}
        return dc_replace(base, llm=with_expert_timing(base.llm, timing), notes=notes)

    merged, _ = median_profile([profile(1.0), profile(3.0), profile(2.0)])
    want = fit_timing(_expert_rows(2.0))
    assert want.fwd_slot_ms == pytest.approx(0.02, rel=1e-6) and want.bwd_call_ms == pytest.approx(
        0.8, rel=1e-6
    )
    assert [layer.experts.measured for layer in merged.llm.layers if layer.experts is not None] == [
        want,
        want,
    ]
    assert merged.notes["experts"]["measurements"] == _expert_rows(2.0)
    assert merged.notes["experts"]["fwd"]["slot_ms"] == want.fwd_slot_ms
    with pytest.raises(ValueError, match="some profiles timed the experts"):
        median_profile([profile(1.0), profile(2.0, timed=False)])
