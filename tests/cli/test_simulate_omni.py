"""``entrain simulate`` on the omni preset (``qwen25-omni-7b``: an audio tower beside the vision tower)
takes the N-encoder path: Entrain, DistTrain-like and DIP-like get their Plan from ``plan_encoders_system`` (one
pipeline per encoder), the other systems are named in ``not_built`` with their one-line reason."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from entrain.cli.main import main
from entrain.cli.simulate import SimulateRequest, simulate
from entrain.core.model.omni import QWEN25_OMNI_7B
from tests.train_front import train_spec, worker_setups

OMNI = ["--model", QWEN25_OMNI_7B, "--dataset", "omni", "--hardware", "a40-flops", "--gpus", "4",
        "--dp", "1", "--global-batch", "8", "--microbatch-size", "2", "--iterations", "1"]  # fmt: skip


def test_omni_preset_plans_one_pipeline_per_encoder_and_names_the_rest(capsys):
    schema = json.loads(resources.files("entrain").joinpath("schemas/simulate.json").read_text())
    assert main(["simulate", *OMNI, "--systems", "entrain,1f1b,disttrain,dip,dflop", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, schema)
    assert list(out["systems"]) == ["entrain", "disttrain", "dip"]
    for s in out["systems"].values():
        assert list(s["config"]["components"]) == ["vision", "audio", "llm"]
        assert s["iteration_time_ms"] >= s["lower_bound_ms"] > 0
    assert "one encoder component" in out["not_built"]["1f1b"]
    assert "not planned by this system yet" in out["not_built"]["dflop"]
    assert all(why.startswith("cannot be built: ") and "\n" not in why for why in out["not_built"].values())
    assert out["model"] == QWEN25_OMNI_7B


def test_each_system_runs_the_plan_its_n_encoder_planner_makes():
    """The runs' plans are ``plan_encoders_system``'s on the profile (b_min's reference draw) and the
    run's global batches, with recomputation fitted to device memory (``fit_recompute``); Entrain's
    through ``fit_entrain`` (its microbatch count chosen by simulation, the decision reported)."""
    from entrain.cli.common import config_sampler, config_workload
    from entrain.cli.main import build_parser
    from entrain.cli.simulate import _encoders
    from entrain.core.planning.encoders import search_encoders
    from entrain.core.planning.encoders_baselines import plan_encoders_system
    from entrain.sim.encoders_run import encoders_profile, fit_entrain, fit_recompute

    req = SimulateRequest.from_args(build_parser().parse_args(["simulate", *OMNI]))
    runs, configs = simulate(req, ["entrain", "disttrain"], choose_towers=False)
    config = req.config
    encoders = _encoders(config)
    _, profile = encoders_profile(config_sampler(config), encoders, config.parallel)
    batches = list(
        config_workload(config, config.model.cost_model()).batches(config.parallel.global_batch, 1)
    )
    for system, run in runs.items():
        if system == "entrain":
            cfg = search_encoders(profile, encoders, config.parallel)[0]
            got, _, made = fit_entrain(cfg, batches, encoders, margin=config.config_request().margin)
            assert run.plan == got.plan
            assert configs[system]["decisions"] == [d.to_json() for d in made]
            continue
        want = plan_encoders_system(system, profile, batches, encoders, config.parallel)
        assert run.plan == fit_recompute(want, encoders).plan  # its recomputation fitted to memory
        assert run.plan.layout.encoder_names == ("vision", "audio") and run.plan.system == system


def test_one_encoder_keeps_todays_path_for_every_system():
    """``simulate(..., one_encoder=True)``: both towers as one encoder component, every system planned."""
    from entrain.cli.main import build_parser

    argv = ["simulate", *OMNI]
    argv[argv.index("--gpus") + 1] = "8"  # at 4 no one-encoder plan of Entrain's fits device memory
    req = SimulateRequest.from_args(build_parser().parse_args(argv))
    runs, configs = simulate(req, ["entrain", "1f1b"], one_encoder=True)
    assert list(runs) == ["entrain", "1f1b"]
    assert all(list(configs[n]["components"]) == ["encoder", "llm"] for n in runs)


def test_simulate_reports_entrains_faster_layout():
    """By default Entrain also runs on the one-encoder path and its run is the faster fitting layout's,
    the ``encoder towers`` decision last in its ``decisions`` (every other system keeps its own path)."""
    from entrain.cli.main import build_parser
    from entrain.cli.simulate import PER_ENCODER, SHARED, TOWERS

    argv = ["simulate", *OMNI]
    argv[argv.index("--gpus") + 1] = "8"
    req = SimulateRequest.from_args(build_parser().parse_args(argv))
    runs, configs = simulate(req, ["entrain", "disttrain"])
    d = configs["entrain"]["decisions"][-1]
    assert (d["name"], set(d["candidates"])) == (TOWERS, {PER_ENCODER, SHARED})
    assert runs["entrain"].metrics.iteration_time_ms == d["candidates"][d["chosen"]]
    comps = {PER_ENCODER: ["vision", "audio", "llm"], SHARED: ["encoder", "llm"]}[d["chosen"]]
    assert list(configs["entrain"]["components"]) == comps
    assert list(configs["disttrain"]["components"]) == ["vision", "audio", "llm"]


def test_flags_the_n_encoder_path_does_not_take_are_refused_in_one_line(capsys):
    for extra, name in ((["--ep", "2"], "--ep"), (["--replan", "auto"], "--replan auto")):
        assert main(["simulate", *OMNI, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert f"no {name} yet" in err and "\n" not in err


def _run(ms: float, fits: bool | None = True):
    from types import SimpleNamespace

    return SimpleNamespace(metrics=SimpleNamespace(iteration_time_ms=ms, fits_memory=fits))


def test_entrain_keeps_the_faster_fitting_of_its_two_layouts():
    """``choose_entrain_towers``: the one-encoder run replaces the N-encoder one only when it is faster
    past the margin and fits; the decision ends the chosen one's ``decisions``."""
    from entrain.cli.simulate import PER_ENCODER, SHARED, TOWERS, choose_entrain_towers

    cases = (
        ((100.0, True), (80.0, True), SHARED),
        ((100.0, True), (99.9, True), PER_ENCODER),  # within the margin: the default
        ((100.0, True), (50.0, False), PER_ENCODER),  # faster but over device memory
        ((100.0, False), (120.0, True), SHARED),  # the N-encoder plan does not fit
    )
    for (n_ms, n_fits), (one_ms, one_fits), want in cases:
        mine, one = _run(n_ms, n_fits), _run(one_ms, one_fits)
        runs, configs = {"entrain": mine, "disttrain": _run(1.0)}, {"entrain": {"decisions": [{"name": "x"}]}}
        d = choose_entrain_towers(runs, configs, one, {"decisions": []}, 0.0033)
        assert (d.name, d.default, d.chosen) == (TOWERS, PER_ENCODER, want)
        assert (
            runs["entrain"] is (one if want == SHARED else mine)
            and runs["disttrain"].metrics.iteration_time_ms == 1.0
        )
        assert configs["entrain"]["decisions"][-1] == d.to_json()
        assert len(configs["entrain"]["decisions"]) == (1 if want == SHARED else 2)


def test_plan_reports_entrains_layout_choice_and_writes_the_chosen_layout(tmp_path, capsys, monkeypatch):
    """``entrain plan`` on the preset simulates Entrain with one pipeline per tower too (the memory check's
    batches) and lists the ``encoder towers`` decision (here both towers in the first stages, 3.8 against
    5.3 s, written to the plan file); where one pipeline per encoder is chosen, ``--out`` writes that
    layout (each encoder's stages named, its degrees under its name, the N-encoder path's decisions),
    which ``train --plan`` reads back with one pipeline per tower."""
    from entrain.cli.simulate import PER_ENCODER, SHARED, TOWERS
    from entrain.core.planning.system_setup import Decision, read_plan_file

    argv = ["plan", "--model", QWEN25_OMNI_7B, "--dataset", "omni", "--hardware", "a40-flops", "--gpus", "8",
            "--global-batch", "8", "--microbatch-size", "2", "--iterations", "1"]  # fmt: skip
    schema = json.loads(resources.files("entrain").joinpath("schemas/plan.json").read_text())
    path = tmp_path / "plan.json"
    assert main([*argv, "--json", "--out", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, schema)
    d = out["decisions"][-1]
    assert (d["name"], d["default"], set(d["candidates"])) == (TOWERS, PER_ENCODER, {PER_ENCODER, SHARED})
    assert d["chosen"] == SHARED and d["candidates"][SHARED] < d["candidates"][PER_ENCODER]
    assert json.loads(path.read_text())["decisions"][-1] == d

    def per_encoder(name, default, ms, margin):
        return Decision(name, PER_ENCODER, dict(ms), margin, default)

    monkeypatch.setattr("entrain.sim.towers.pick", per_encoder)
    other = tmp_path / "other.json"
    assert main([*argv, "--out", str(other)]) == 0
    assert f"{TOWERS}: {PER_ENCODER}" in capsys.readouterr().out
    written = json.loads(other.read_text())
    jsonschema.validate(written, schema)
    assert list(written["layout"]["components"]) == ["vision", "audio", "llm"]
    named = [s["encoder"] for s in written["layout"]["stages"] if s["component"] == "encoder"]
    assert list(dict.fromkeys(named)) == ["vision", "audio"]
    assert written["source"].startswith("N-encoder planner (vision, audio)")
    assert written["decisions"][-1]["chosen"] == PER_ENCODER
    assert {x["name"] for x in written["decisions"][:-1]} <= {"microbatch count"}  # the N-encoder path's own
    _, setup = read_plan_file(str(other))
    assert setup.layout.encoder_names == ("vision", "audio") and setup.config is not None


def test_plan_writes_disttrains_groups_per_tower_as_train_fits_them(tmp_path, monkeypatch):
    """``plan --system disttrain --out`` on the preset writes one group per tower memory-fitted as ``train
    --system disttrain`` fits it (``runtime.planning.fit_towers_setup``: the same draws whatever train's
    ``--steps``; here the vision stage and most LLM stages recomputed), equal to the layout ``train`` plans
    with its worker's planner callables; ``train --plan`` of the file reads that layout back."""
    from entrain.runtime.planning import run_setups
    from entrain.runtime.run_data import load_data

    run = ["--model", QWEN25_OMNI_7B, "--dataset", "omni", "--hardware", "a40-flops", "--global-batch", "8",
           "--microbatch-size", "2", "--system", "disttrain"]  # fmt: skip
    path = tmp_path / "plan.json"
    assert main(["plan", *run, "--gpus", "8", "--out", str(path)]) == 0
    written = json.loads(path.read_text())
    assert list(written["layout"]["components"]) == ["vision", "audio", "llm"]
    assert [s["encoder"] for s in written["layout"]["stages"] if s["component"] == "encoder"] == [
        "vision",
        "audio",
    ]
    assert any(s.get("recompute", "none") != "none" for s in written["layout"]["stages"])  # the fit ran
    spec = train_spec(monkeypatch, [*run, "--nproc", "8", "--steps", "1", "--out", str(tmp_path / "run")])
    cost = spec.model.cost_model()
    batches = load_data(spec, cost).train
    setup = worker_setups(spec, cost, batches, 8)["disttrain"]
    assert setup.layout.to_json() == written["layout"] and setup.source == written["source"]
    spec = train_spec(
        monkeypatch, ["--plan", str(path), "--nproc", "8", "--steps", "1", "--out", str(tmp_path / "p")]
    )
    assert run_setups(spec, cost, batches, 8)["disttrain"].layout == setup.layout


@pytest.mark.parametrize("system", ["1f1b", "dip", "dip-greedy"])
def test_plan_keeps_both_towers_in_the_first_stages_where_train_does(tmp_path, monkeypatch, system):
    """1F1B and DIP-like train both towers as one encoder component on the preset (``runtime.planning``
    plans one group per tower for Entrain and DistTrain-like only); ``plan --system`` writes that path too."""
    from entrain.cli import train_worker as worker
    from entrain.runtime.planning import run_setups
    from entrain.runtime.run_data import load_data

    run = ["--model", QWEN25_OMNI_7B, "--dataset", "omni", "--hardware", "a40-flops", "--global-batch", "8",
           "--microbatch-size", "2", "--system", system]  # fmt: skip
    path = tmp_path / "plan.json"
    assert main(["plan", *run, "--gpus", "8", "--iterations", "1", "--out", str(path)]) == 0
    written = json.loads(path.read_text())
    assert written["system"] == system and list(written["layout"]["components"]) == ["encoder", "llm"]
    assert all("encoder" not in s for s in written["layout"]["stages"])
    spec = train_spec(monkeypatch, [*run, "--nproc", "8", "--steps", "1", "--out", str(tmp_path / "run")])
    cost = spec.model.cost_model()
    setup = run_setups(spec, cost, load_data(spec, cost).train, 8, encoders_profile=worker._encoders_profile)[
        system
    ]
    assert not setup.layout.multi_encoder and list(setup.layout.components) == ["encoder", "llm"]
