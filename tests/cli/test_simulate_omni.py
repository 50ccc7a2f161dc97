"""``entrain simulate`` on the omni preset (``qwen25-omni-7b``: an audio tower beside the vision tower)
takes the N-encoder path: Entrain and DistTrain-like get their Plan from ``plan_encoders_system`` (one
pipeline per encoder), the other systems are named in ``not_built`` with their one-line reason."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema

from entrain.cli.main import main
from entrain.cli.simulate import SimulateRequest, simulate
from entrain.core.model.omni import QWEN25_OMNI_7B

OMNI = ["--model", QWEN25_OMNI_7B, "--dataset", "omni", "--hardware", "a40-flops", "--gpus", "4",
        "--dp", "1", "--global-batch", "8", "--microbatch-size", "2", "--iterations", "1"]  # fmt: skip


def test_omni_preset_plans_one_pipeline_per_encoder_and_names_the_rest(capsys):
    schema = json.loads(resources.files("entrain").joinpath("schemas/simulate.json").read_text())
    assert main(["simulate", *OMNI, "--systems", "entrain,1f1b,disttrain,dip", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, schema)
    assert list(out["systems"]) == ["entrain", "disttrain"]
    for s in out["systems"].values():
        assert list(s["config"]["components"]) == ["vision", "audio", "llm"]
        assert s["iteration_time_ms"] >= s["lower_bound_ms"] > 0
    assert "one encoder component" in out["not_built"]["1f1b"]
    assert "not planned by this system yet" in out["not_built"]["dip"]
    assert all(why.startswith("cannot be built: ") and "\n" not in why for why in out["not_built"].values())
    assert out["model"] == QWEN25_OMNI_7B


def test_each_system_runs_the_plan_its_n_encoder_planner_makes():
    """The runs' plans are ``plan_encoders_system``'s on the profile (b_min's reference draw) and the
    run's global batches, with recomputation fitted to device memory (``fit_recompute``)."""
    from entrain.cli.common import config_sampler, config_workload
    from entrain.cli.main import build_parser
    from entrain.cli.simulate import _encoders
    from entrain.core.planning.encoders_baselines import plan_encoders_system
    from entrain.sim.encoders_run import encoders_profile, fit_recompute

    req = SimulateRequest.from_args(build_parser().parse_args(["simulate", *OMNI]))
    runs, _ = simulate(req, ["entrain", "disttrain"])
    config = req.config
    encoders = _encoders(config)
    _, profile = encoders_profile(config_sampler(config), encoders, config.parallel)
    batches = list(
        config_workload(config, config.model.cost_model()).batches(config.parallel.global_batch, 1)
    )
    for system, run in runs.items():
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


def test_flags_the_n_encoder_path_does_not_take_are_refused_in_one_line(capsys):
    for extra, name in ((["--ep", "2"], "--ep"), (["--replan", "auto"], "--replan auto")):
        assert main(["simulate", *OMNI, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert f"no {name} yet" in err and "\n" not in err
