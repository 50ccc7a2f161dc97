"""``entrain profile --from-trace RUN --out FILE``: a short real 2-rank CPU run with
``--trace`` (two forked gloo workers, no torchrun) is refitted into a profile of the schema of every
profile, which ``simulate --profile`` takes, and which predicts that run's stage times better than
the run's own (analytic) cost model did."""

from __future__ import annotations

import contextlib
import io
import json
from importlib import resources

import jsonschema
import pytest

from entrain.cli.main import build_parser, main
from entrain.cli.plot_trace import run_model_config
from entrain.cli.train import _spec
from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.presets import build_cost_model
from entrain.runtime.session import run_systems
from entrain.sim.trace_fit import load_run, stage_errors
from tests.runtime.harness import run_workers


def _train(env, spec):
    return [s.last_loss for s in run_systems(spec, env)]


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("from_trace")
    run = tmp / "run"
    argv = ["train", "--model", "tiny", "--dataset", "skewed", "--system", "entrain", "--global-batch", "8",
            "--microbatch-size", "1", "--encoder-stages", "1", "--llm-stages", "1", "--steps", "2",
            "--out", str(run), "--no-progress", "--trace"]  # fmt: skip
    run_workers(_train, 2, tmp / "workers", _spec(build_parser().parse_args(argv)), timeout_s=120)
    out = tmp / "refit.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["profile", "--from-trace", str(run), "--out", str(out), "--json"]) == 0
    return run, out, json.loads(buf.getvalue())


def test_refit_has_the_schema_of_every_profile(traced):
    _, out, doc = traced
    schema = json.loads(resources.files("entrain").joinpath("schemas/profile.json").read_text())
    jsonschema.validate(doc, schema)
    cost = CostModel.load(str(out), expect_model="tiny")
    analytic = build_cost_model("tiny", "cpu-tiny")
    assert json.loads(out.read_text()).keys() == analytic.to_json().keys()
    for comp in ("encoder", "llm"):
        assert cost.component(comp).layer_names == analytic.component(comp).layer_names
    assert cost.notes["source"] == "entrain profile" and cost.notes["precision"] == "fp32"
    assert {(f["phase"], f["kind"]) for f in doc["fits"]} == {("fwd", "stage"), ("bwd", "stage")}


def test_refit_predicts_the_runs_stage_times_better(traced, capsys):
    run_dir, out, doc = traced
    run = load_run(str(run_dir), lambda spec: run_model_config(spec).cost_model())
    base, refit = stage_errors(run, run.base), stage_errors(run, CostModel.load(str(out)))
    assert refit["busy_mean_rel_error"] < base["busy_mean_rel_error"]
    assert refit["span_mean_rel_error"] < base["span_mean_rel_error"]
    assert doc["from_trace"]["errors"]["refit"] == pytest.approx(refit)
    argv = ["simulate", "--model", "tiny", "--dataset", "skewed", "--gpus", "2", "--global-batch", "8",
            "--microbatch-size", "1", "--systems", "entrain", "--iterations", "2", "--json"]  # fmt: skip
    assert main([*argv, "--profile", str(out)]) == 0
    refitted = json.loads(capsys.readouterr().out)["systems"]["entrain"]["iteration_time_ms"]
    assert main(argv) == 0
    preset = json.loads(capsys.readouterr().out)["systems"]["entrain"]["iteration_time_ms"]
    assert refitted != pytest.approx(preset)


def test_a_run_without_trace_is_a_one_line_error(traced, tmp_path, capsys):
    run_dir, _, _ = traced
    for name in ("config.json", "plan.json", "metrics.jsonl"):
        (tmp_path / name).write_text((run_dir / name).read_text())
    assert main(["profile", "--from-trace", str(tmp_path), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == f"entrain profile: error: --from-trace {tmp_path / 'trace.json'}: missing (train with --trace)"
    )
