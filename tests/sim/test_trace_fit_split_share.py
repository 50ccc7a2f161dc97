"""``entrain profile --from-trace`` on a run with split backwards: each split stage's measured ``I``
share of its backward (``I / (I + W)``) becomes its layers' ``bwd_input_fraction``. The synthetic
machine's ``I`` is 80 % of a backward (``W`` 20 %), so an ``I`` read as a ``W`` shows. (The first
stage passes no gradient on: its ``I`` computes nothing, and its share is 0.)"""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace

import pytest

from entrain.cli.main import main
from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.presets import build_cost_model
from entrain.core.systems import plan_system
from entrain.core.workload.samples import VisionTokenConfig
from entrain.data.sampling import dataset_sampler
from entrain.sim.choose import planner_draws

from .test_trace_refit_decision import MAX_PIXELS, REQ, _setups, write_run_folder

INPUT_SHARE = 0.8


def _machine(preset: CostModel) -> CostModel:
    def share(layers):
        return tuple(replace(x, bwd_input_fraction=INPUT_SHARE) for x in layers)

    return replace(
        preset,
        encoder=replace(preset.encoder, layers=share(preset.encoder.layers)),
        llm=replace(preset.llm, layers=share(preset.llm.layers)),
    )


def test_a_split_runs_input_gradient_share_is_fitted(tmp_path):
    preset = build_cost_model("tiny", "cpu-tiny")
    setup = _setups(preset)["entrain"]
    sampler = dataset_sampler(REQ.dataset, REQ.seed, vision=VisionTokenConfig(max_pixels=MAX_PIXELS))
    draws = planner_draws(sampler, preset, REQ)
    plan = plan_system("entrain", setup.layout, draws, preset, {**setup.options, "split_weight_grads": True})
    split = {a.stage for it in plan.iterations for acts in it.actions.values() for a in acts if a.kind == "I"}
    assert split - {0}, "the plan splits no backward after the first stage"
    folder = write_run_folder(tmp_path, plan, _machine(preset))
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(["profile", "--from-trace", str(folder), "--out", str(tmp_path / "refit.json")]) == 0
    refit = CostModel.load(str(tmp_path / "refit.json"))
    for stage in sorted(split - {0}):  # the first stage passes no gradient on: its I computes nothing
        spec = plan.layout.stages[stage]
        got = [
            refit.component(spec.component).layers[i].bwd_input_fraction
            for i in range(spec.first_layer, spec.end_layer)
        ]
        assert got == pytest.approx([INPUT_SHARE] * len(got), abs=0.05), (
            stage
        )  # the split's own extra cost moves it a little
