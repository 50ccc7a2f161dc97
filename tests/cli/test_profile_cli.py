"""``entrain profile``: measured per-layer costs in the analytic presets' schema, fit quality in the
--json output, and the profile accepted by ``plan``, ``assign``, ``simulate`` and ``train``."""

from __future__ import annotations

import json
import re
from importlib import resources

import jsonschema
import pytest

from entrain.cli.main import main
from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.presets import build_cost_model

TOKENS = "8,16,32"


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """(profile path, --json output) of tiny at tiny sizes, one timed run each."""
    out = tmp_path_factory.mktemp("profile") / "tiny.json"
    argv = ["profile", "--model", "tiny", "--device", "cpu", "--tokens", TOKENS, "--repeats", "1"]
    argv += ["--warmup", "0", "--out", str(out), "--json"]
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return out, json.loads(buf.getvalue())


def test_profile_tiny_writes_a_loadable_cost_model(profiled):
    out, _ = profiled
    cost = CostModel.load(str(out))
    analytic = build_cost_model("tiny", "cpu-tiny")
    assert json.loads(out.read_text()).keys() == analytic.to_json().keys()
    for comp in ("encoder", "llm"):
        assert cost.component(comp).layer_names == analytic.component(comp).layer_names
        for layer, base in zip(cost.component(comp).layers, analytic.component(comp).layers):
            assert layer.kind == base.kind and layer.param_bytes == base.param_bytes
            assert set(layer.fwd) == set(layer.bwd) == {"tp1cp1"}
            q = layer.fwd["tp1cp1"]
            assert min(q.a, q.b, q.c) >= 0 and q(32) > 0
    assert cost.notes["source"] == "entrain profile"
    # lm_head and the loss are measured and priced per label token
    assert [layer.per_label for layer in cost.llm.layers] == [False] * 4 + [True] * 2
    # one decoder layer measured, replicated onto the other
    assert cost.llm.layers[1].fwd == cost.llm.layers[2].fwd
    assert cost.notes["representatives"]["llm"]["layers.1"] == "layers.0"


def test_profile_json_matches_schema_and_reports_fit_quality(profiled):
    _, doc = profiled
    schema = json.loads(resources.files("entrain").joinpath("schemas/profile.json").read_text())
    jsonschema.validate(doc, schema)
    # tiny: patch_embed, 2 block kinds, merger; embedding, 1 decoder layer, norm, lm_head, loss
    assert len(doc["fits"]) == 2 * 9
    for fit in doc["fits"]:
        if fit["table"]:  # only where the quadratic misses by > 20 % and the table does better
            assert fit["worst_rel_residual"] > 0.2
            assert fit["used_worst_rel_residual"] < fit["worst_rel_residual"]
        else:
            assert fit["used_worst_rel_residual"] == fit["worst_rel_residual"]


def test_profile_prints_fit_quality_per_layer(tmp_path, capsys):
    out = tmp_path / "p.json"
    argv = ["profile", "--model", "tiny", "--device", "cpu", "--tokens", "8,16", "--repeats", "1"]
    assert main([*argv, "--warmup", "0", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "R^2" in x]
    assert len(lines) == 18
    assert all(re.search(r"R\^2 +-?[\d.]+ +worst residual +[\d.]+%", x) for x in lines)
    assert "layers.0" in err and "decoder_layer" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tokens", "64"], "at least 2"),
        (["--tokens", "64,x"], "comma list"),
        (["--repeats", "0"], "--repeats"),
    ],
)
def test_profile_rejects_bad_flags(argv, message, capsys):
    assert main(["profile", *argv, "--out", "x.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


@pytest.mark.parametrize("command", ["plan", "assign", "simulate"])
def test_profile_is_accepted_by_planning_commands(profiled, command, capsys):
    out, _ = profiled
    argv = [command, "--model", "tiny", "--profile", str(out), "--dataset", "skewed", "--gpus", "4"]
    argv += ["--global-batch", "8", "--microbatch-size", "2", "--iterations", "1", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == "tiny"
    if command == "plan":
        assert doc["hardware"] == "profile-cpu"


def test_profile_changes_the_plan(profiled, capsys):
    """The planner prices with the profile, not the preset: predicted times differ."""
    out, _ = profiled
    argv = ["plan", "--model", "tiny", "--dataset", "skewed", "--gpus", "4", "--global-batch", "8"]
    argv += ["--microbatch-size", "2", "--iterations", "1", "--json"]
    assert main([*argv, "--profile", str(out)]) == 0
    measured = json.loads(capsys.readouterr().out)["predicted_iteration_time_ms"]
    assert main(argv) == 0
    preset = json.loads(capsys.readouterr().out)["predicted_iteration_time_ms"]
    assert measured != pytest.approx(preset)


def test_profile_is_accepted_by_train(profiled, tmp_path, capsys):
    """Single-process (DIP, 1 + 1 colocated stages) training planned from the profile."""
    out, _ = profiled
    run = tmp_path / "run"
    argv = ["train", "--model", "tiny", "--dataset", "skewed", "--global-batch", "2"]
    argv += ["--microbatch-size", "1", "--system", "dip", "--steps", "1", "--no-progress"]
    assert main([*argv, "--profile", str(out), "--out", str(run)]) == 0
    assert capsys.readouterr().out.startswith("system=dip")
    config = json.loads((run / "config.json").read_text())
    assert config["spec"]["profile"] == str(out)
    assert len(json.loads((run / "plan.json").read_text())["iterations"]) == 1
