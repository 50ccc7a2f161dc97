"""One refit from two runs whose Plans cut the components at other layers.

The paired CPU runs' Entrain Plans cut the encoder where 1F1B runs it whole (``multi-image``: encoder
layers [0,3) on rank 0, the merger with the LLM on rank 1). A refit from the 1F1B trace alone scales
the whole encoder at once and keeps the preset's split inside it, so where the preset misprices a layer
against the others it mispredicts Entrain's stages (``docs/profiling.md``, "what is left").
Here the "machine" is ``cpu-tiny`` with the merger at half and the full-attention block at 1.5 times
the preset's time, 1 ms more per compute action, and a backward split into ``I`` + ``W`` costing
``SPLIT_EXTRA`` more than a whole one (``LayerCost.split_extra_fraction``, ``split_extra_ms``: 1F1B
runs whole backwards, Entrain split ones); synthetic traces of both Plans run on it, and the runs
were planned with the plain preset. ``entrain profile --from-trace 1F1B --also-trace ENTRAIN`` fits
both at once and predicts both Plans as the machine runs them; the 1F1B refit alone does not."""

from __future__ import annotations

import contextlib
import io
import json
import statistics
from dataclasses import replace
from importlib import resources

import jsonschema
import pytest

from entrain.cli.main import main
from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.presets import build_cost_model
from entrain.core.systems import plan_system
from entrain.core.workload.samples import VisionTokenConfig
from entrain.data.sampling import dataset_sampler
from entrain.sim.choose import planner_draws
from entrain.sim.executor import simulate_plan

from .test_trace_refit_decision import MAX_PIXELS, OVERHEAD_MS, REQ, _setups, write_run_folder

LAYER_SCALES = {"merger": 0.5, "vit_block_full": 1.5}
SPLIT_EXTRA = {"split_extra_fraction": 0.1, "split_extra_ms": 0.3}
INSIDE_MS = 1.0
"""Per compute action, inside it (a stage call's own cost, which no layer curve has)."""


def _machine() -> CostModel:
    """The preset with ``LAYER_SCALES`` applied to those layers' curves, ``SPLIT_EXTRA`` on every layer
    and ``INSIDE_MS`` per action."""
    base = build_cost_model("tiny", "cpu-tiny").to_json()
    for layer in (*base["components"]["encoder"]["layers"], *base["components"]["llm"]["layers"]):
        scale = LAYER_SCALES.get(layer["kind"], 1.0)
        for phase in ("fwd", "bwd"):
            for q in layer[phase].values():
                q.update(a=q["a"] * scale, b=q["b"] * scale, c=q["c"] * scale)
        layer.update(SPLIT_EXTRA)
    cost = CostModel.from_json(base)
    return replace(cost, hardware=replace(cost.hardware, action_overhead_ms=INSIDE_MS))


def _refit(*args: str, out) -> CostModel:
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(["profile", "--from-trace", *args, "--out", str(out)]) == 0
    return CostModel.load(str(out))


def _ms(plan, cost: CostModel) -> float:
    return statistics.median(r.iteration_time_ms for r in simulate_plan(plan, cost, trace_iterations=0))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(Plans by system, the machine's cost model with the gaps folded in, 1F1B refit, joint refit)."""
    preset = build_cost_model("tiny", "cpu-tiny")
    setups = _setups(preset)
    sampler = dataset_sampler(REQ.dataset, REQ.seed, vision=VisionTokenConfig(max_pixels=MAX_PIXELS))
    draws = planner_draws(sampler, preset, REQ)
    plans = {
        s: plan_system(s, setups[s].layout, draws, preset, setups[s].options) for s in ("1f1b", "entrain")
    }
    assert len(plans["entrain"].layout.stages) == 3  # the encoder cut: [0,3) | merger + LLM
    machine = _machine()
    tmp = tmp_path_factory.mktemp("joint")
    folders = {}
    for system, plan in plans.items():
        (tmp / system).mkdir()
        folders[system] = str(write_run_folder(tmp / system, plan, machine))
    # the simulator charges the traces' gaps per action as well: what the runs "measured"
    truth = replace(machine, hardware=replace(machine.hardware, action_overhead_ms=INSIDE_MS + OVERHEAD_MS))
    single = _refit(folders["1f1b"], out=tmp / "single.json")
    joint = _refit(folders["1f1b"], "--also-trace", folders["entrain"], out=tmp / "joint.json")
    return plans, truth, single, joint, folders


def test_the_joint_refit_predicts_both_plans_as_they_ran(runs):
    plans, truth, _, joint, _ = runs
    for system, plan in plans.items():
        assert _ms(plan, joint) == pytest.approx(_ms(plan, truth), rel=0.02), system
    real = _ms(plans["entrain"], truth) / _ms(plans["1f1b"], truth)
    assert _ms(plans["entrain"], joint) / _ms(plans["1f1b"], joint) == pytest.approx(real, rel=0.01)
    assert joint.notes["per_action_ms"] == pytest.approx(INSIDE_MS, abs=0.3)


def test_the_joint_refit_finds_what_a_split_backward_costs_more(runs):
    """1F1B's whole backwards next to Entrain's split ones tell the split's own cost apart: the decoder
    layers' extra share comes out as the machine's, and the joint fit is by layer kind (the default)."""
    *_, joint, _ = runs
    assert joint.notes["fit_groups"] == "kinds"
    decoders = [x for x in joint.llm.layers if x.kind == "decoder_layer"]
    extra = SPLIT_EXTRA["split_extra_fraction"]
    assert all(x.split_extra_fraction == pytest.approx(extra, abs=0.02) for x in decoders)


def test_the_1f1b_refit_alone_mispredicts_the_cut_encoder(runs):
    """The contrast that makes the joint fit necessary: one encoder stage cannot tell the merger's
    share, so Entrain's ratio to 1F1B comes out wrong by more than the joint fit's error."""
    plans, truth, single, joint, _ = runs
    real = _ms(plans["entrain"], truth) / _ms(plans["1f1b"], truth)
    one = _ms(plans["entrain"], single) / _ms(plans["1f1b"], single)
    both = _ms(plans["entrain"], joint) / _ms(plans["1f1b"], joint)
    assert abs(one / real - 1) > 2 * abs(both / real - 1) and abs(one / real - 1) > 0.01


def test_the_joint_refit_json_has_the_profile_schema_and_names_every_run(runs, tmp_path, capsys):
    *_, folders = runs
    argv = ["profile", "--from-trace", folders["1f1b"], "--also-trace", folders["entrain"]]
    with contextlib.redirect_stderr(io.StringIO()):
        assert main([*argv, "--out", str(tmp_path / "j.json"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    schema = json.loads(resources.files("entrain").joinpath("schemas/profile.json").read_text())
    jsonschema.validate(doc, schema)
    assert [a["run"] for a in doc["from_trace"]["also"]] == [folders["entrain"]]
    also = doc["from_trace"]["also"][0]["errors"]
    assert also["refit"]["busy_mean_rel_error"] < also["base"]["busy_mean_rel_error"]
    assert main(["profile", "--also-trace", folders["entrain"], "--out", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err.strip() == (
        "entrain profile: error: --also-trace needs --from-trace (the runs to fit together)"
    )


def _span_ms(cost: CostModel, comp: str, span: range, phase: str, x: int) -> float:
    return sum(cost.layer_ms(comp, i, [x], phase, num_calls=0) for i in span)


def test_layers_no_traced_cut_separates_split_their_fitted_total_as_the_base_does(runs):
    """Both runs cut the encoder at 3 only: the window blocks (1x on the machine) and the full-attention
    block (1.5x) are never timed apart, nor are the LLM's layers, so the refit keeps each range's
    measured total (every size, every term) and splits it among the range's layers in the preset's
    proportions (each term of each layer scaled alike), not where the fit's kinds happened to land; the
    merger, which a traced cut sets apart, keeps its own scale (0.5x)."""
    _, truth, _, joint, _ = runs
    preset = build_cost_model("tiny", "cpu-tiny")
    assert joint.notes["split_by_base"] == [
        {"component": "encoder", "layers": [0, 1, 2]},
        {"component": "llm", "layers": [0, 1, 2, 3, 4, 5]},
    ]
    for comp, span in (("encoder", range(3)), ("encoder", range(3, 4)), ("llm", range(6))):
        for phase in ("fwd", "bwd"):
            for x in (4, 256, 4096):
                fitted, real = _span_ms(joint, comp, span, phase, x), _span_ms(truth, comp, span, phase, x)
                assert fitted == pytest.approx(real, rel=1e-3), (comp, span, phase, x)
    for phase in ("fwd", "bwd"):
        scales: dict[tuple[str, str], set[float]] = {}
        for i in range(3):
            for key, q in getattr(preset.encoder.layers[i], phase).items():
                fitted = getattr(joint.encoder.layers[i], phase)[key]
                for term in ("a", "b"):
                    if getattr(q, term) > 0:
                        scales.setdefault((key, term), set()).add(
                            round(getattr(fitted, term) / getattr(q, term), 6)
                        )
        assert scales and all(len(s) == 1 for s in scales.values()), (phase, scales)
        assert all(abs(min(s) - 1.0) > 0.02 for s in scales.values())  # not the preset: a fitted share
        merger = getattr(joint.encoder.layers[3], phase)["tp1cp1"]
        assert merger.b == pytest.approx(0.5 * getattr(preset.encoder.layers[3], phase)["tp1cp1"].b, rel=1e-3)
