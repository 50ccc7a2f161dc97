"""``entrain train`` of a tiny Qwen2.5-Omni thinker on 3 forked ranks, the planner choosing the layout:
Entrain makes ``plan``'s ``encoder towers`` decision on ``plan``'s draws (``sim.towers``, handed in as
``run_setups``' ``encoders_towers``) and plans one pipeline per encoder tower (the N-encoder planner's
profile and search, as ``entrain simulate`` does for such a model), a vision rank and an audio rank
feeding the LLM rank, and the run trains its steps on the ``omni`` draw (images, audio clips, videos
with their tracks) with every step's Plan in ``plan.json`` and the decisions in ``config.json``: those
``entrain plan`` writes. ``train --plan`` of that plan file trains the same Plans and losses."""

from __future__ import annotations

import json
import math

import pytest

from entrain.cli.main import main
from entrain.core.ir.plan import Plan
from tests.models.qwen2_5_omni_tiny import save_whole
from tests.train_front import train_spec, worker_setups

from .cli_ranks import run_ranks

STEPS = 2


def _rows(out) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


KEEP = ["--decision-margin", "99"]
"""On this thinker both towers in the first stages simulate faster (934 against 1046 ms); a margin past
that keeps every decision's default: one pipeline per encoder, the paper's microbatch count."""


def _model(folder, margin: list[str] = KEEP) -> list[str]:
    return ["--model-path", str(folder), "--dataset", "omni", "--hardware", "cpu-tiny", "--global-batch", "4",
            "--microbatch-size", "1", *margin]  # fmt: skip


def _thinker_spec(monkeypatch, folder, out, *flags: str):
    """The spec ``entrain train`` of the thinker at ``folder`` (the default margin, 2 steps, ``flags``)
    hands its launch (stubbed: no rank starts)."""
    return train_spec(monkeypatch, [*_model(folder, []), "--steps", "2", *flags, "--out", str(out)])


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """The tiny thinker and ``entrain plan --gpus 3 --out`` of it, with ``KEEP`` and with the default margin."""
    root = tmp_path_factory.mktemp("omni_plan")
    folder = save_whole(root / "tiny", text_layers=2, vision_depth=2, audio_layers=1)
    paths = root / "plan.json", root / "plan_default.json"
    for path, margin in zip(paths, (KEEP, [])):
        assert main(["plan", *_model(folder, margin), "--gpus", "3", "--out", str(path)]) == 0
    return folder, *paths


def test_train_plans_one_pipeline_per_tower_as_plan_writes_it(tmp_path, planned):
    folder, path, _ = planned
    model = _model(folder)
    written = json.loads(path.read_text())
    assert [d["name"] for d in written["decisions"]][-1] == "encoder towers"
    assert written["decisions"][-1]["chosen"] == "one pipeline per encoder"
    out, steps = tmp_path / "run", ["--steps", str(STEPS), "--no-progress", "--hardware", "cpu-tiny"]
    results = run_ranks(["train", *model, *steps, "--out", str(out)], 3, tmp_path / "ranks", timeout_s=120)
    assert [r.exitcode for r in results] == [0, 0, 0], "".join(r.stderr[-3000:] for r in results)
    config = json.loads((out / "config.json").read_text())
    assert config["setup"].startswith("N-encoder planner (vision, audio)"), config["setup"]
    assert config["decisions"] == written["decisions"]  # train decided as plan did, on plan's draws
    assert config["layout"] == written["layout"]
    plan = Plan.from_json(json.loads((out / "plan.json").read_text()))
    assert plan.layout.encoder_names == ("vision", "audio")
    assert [len(g) for g in plan.layout.encoder_groups] == [1, 1] and plan.layout.world_size == 3
    assert len(plan.iterations) == STEPS
    rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 and r["grad_norm"] > 0 for r in rows)
    again = tmp_path / "again"  # the plan file, run: its layout, microbatches and losses are train's own
    argv = ["train", "--plan", str(path), *steps, "--out", str(again)]
    results = run_ranks(argv, 3, tmp_path / "ranks_plan", timeout_s=120)
    assert [r.exitcode for r in results] == [0, 0, 0], "".join(r.stderr[-3000:] for r in results)
    assert Plan.from_json(json.loads((again / "plan.json").read_text())) == plan
    assert json.loads((again / "config.json").read_text())["decisions"] == written["decisions"]  # the file's
    assert [(r["loss"], r["grad_norm"]) for r in _rows(again)] == [(r["loss"], r["grad_norm"]) for r in rows]


def test_train_plan_runs_the_files_encoder_pipelines(tmp_path, monkeypatch, planned):
    """``train --plan`` of a plan with one pipeline per encoder takes the file's layout (here its first
    stage recomputed in full) and microbatch count (here ``requested``) and plans every step on them,
    not on what the planner would choose."""
    from entrain.runtime.planning import EncodersStepPlanner, run_encoders, run_setups
    from entrain.runtime.run_data import load_data

    folder, path, _ = planned
    d = json.loads(path.read_text())
    d["layout"]["stages"][0]["recompute"] = "full"
    d["schedule_options"]["microbatch_count"] = "requested"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(d))
    argv = ["--plan", str(edited), "--hardware", "cpu-tiny", "--steps", "2", "--out", str(tmp_path / "run")]
    spec = train_spec(monkeypatch, argv)
    cost = spec.model.cost_model()
    batches = load_data(spec, cost).train
    setup = run_setups(spec, cost, batches, 3)["entrain"]
    assert setup.layout.to_json() == d["layout"] and setup.config.microbatch_count == "requested"
    plan = EncodersStepPlanner(run_encoders(spec), setup.config, "entrain", setup.layout)(0, batches[0])
    assert plan.layout == setup.layout and plan.options == {"microbatch_count": "requested"}


def test_train_decides_the_towers_as_plan_does(tmp_path, monkeypatch, planned):
    """At the default margin ``entrain plan`` chooses both towers in the first stages; ``train`` without
    ``--plan`` (its worker's planner callables) makes the same decisions with the same candidate times and
    takes the layout the plan file holds."""
    from entrain.runtime.run_data import load_data

    folder, _, path = planned
    written = json.loads(path.read_text())
    assert written["decisions"][-1]["chosen"] == "both in the first stages"
    spec = _thinker_spec(monkeypatch, folder, tmp_path / "run")
    cost = spec.model.cost_model()
    setup = worker_setups(spec, cost, load_data(spec, cost).train, 3)["entrain"]
    assert [d.to_json() for d in setup.decisions] == written["decisions"]
    assert cost.layout_with_parts(setup.layout).to_json() == written["layout"]


def test_where_the_one_encoder_path_fits_nowhere_the_towers_stay_apart(
    tmp_path, monkeypatch, capsys, planned
):
    """Where no one-encoder plan of Entrain's fits device memory (the memory check's error, here raised
    by a stand-in), ``plan`` and ``train`` choose one pipeline per tower (the candidate ``null`` / ``inf``);
    where Algorithm 2 finds no one-encoder configuration at all, ``train`` plans one pipeline per tower
    without the decision, as before it made one."""
    from entrain.core.errors import ConfigError
    from entrain.runtime import planning
    from entrain.runtime.run_data import load_data

    def no_fit(*args, **kwargs):
        raise ConfigError("no plan fits in device memory (stand-in)")

    folder, _, _ = planned
    with monkeypatch.context() as m:
        m.setattr("entrain.cli.plan.deploy", no_fit)
        path = tmp_path / "plan.json"
        assert main(["plan", *_model(folder, []), "--gpus", "3", "--json", "--out", str(path)]) == 0
    d = json.loads(capsys.readouterr().out)["decisions"][-1]
    assert (d["chosen"], d["candidates"]["both in the first stages"]) == ("one pipeline per encoder", None)
    assert list(json.loads(path.read_text())["layout"]["components"]) == ["vision", "audio", "llm"]
    spec = _thinker_spec(monkeypatch, folder, tmp_path / "run")
    cost = spec.model.cost_model()
    batches = load_data(spec, cost).train
    with monkeypatch.context() as m:
        m.setattr("entrain.sim.towers.deploy", no_fit)
        setup = worker_setups(spec, cost, batches, 3)["entrain"]
    assert setup.layout.multi_encoder and setup.decisions[-1].candidates["both in the first stages"] == float(
        "inf"
    )
    monkeypatch.setattr(planning, "system_setups", no_fit)
    setup = worker_setups(spec, cost, batches, 3)["entrain"]
    assert setup.source.startswith("N-encoder planner (vision, audio)") and setup.decisions == ()


def test_the_memory_check_recomputes_as_simulate(tmp_path, monkeypatch, planned):
    """``run_setups`` hands the two-encoder setup's Plan of the check batches to the memory fit (``simulate``'s
    ``fit_recompute`` in ``entrain train``; here a fit that recomputes every stage in full) and the run's
    layout and every step's Plan carry what it returns."""
    from dataclasses import replace

    from entrain.runtime.planning import EncodersStepPlanner, run_encoders, run_setups
    from entrain.runtime.run_data import load_data
    from entrain.sim.encoders_run import encoders_profile

    spec = _thinker_spec(monkeypatch, planned[0], tmp_path / "run", "--no-progress")
    cost = spec.model.cost_model()
    batches = load_data(spec, cost).train

    def full(plan, encoders):
        return replace(plan.layout, stages=tuple(replace(s, recompute="full") for s in plan.layout.stages))

    setup = run_setups(spec, cost, batches, 3, encoders_profile=encoders_profile, encoders_fit=full)[
        "entrain"
    ]
    assert setup.layout.multi_encoder and {s.recompute for s in setup.layout.stages} == {"full"}
    planner = EncodersStepPlanner(run_encoders(spec), setup.config, "entrain", setup.layout)
    assert planner(1, batches[1]).layout == setup.layout


def test_replan_auto_is_refused_in_one_line(tmp_path, monkeypatch, planned):
    """The drift monitor re-plans one-encoder layouts only: ``--replan auto`` with one pipeline per tower
    is refused before any rank trains."""
    from entrain.core.errors import ConfigError
    from entrain.runtime.planning import run_setups
    from entrain.runtime.run_data import load_data
    from entrain.sim.encoders_run import encoders_profile

    spec = _thinker_spec(monkeypatch, planned[0], tmp_path / "run", "--replan", "auto")
    cost = spec.model.cost_model()
    with pytest.raises(ConfigError, match="--replan auto: entrain plans one pipeline per encoder tower") as e:
        run_setups(spec, cost, load_data(spec, cost).train, 3, encoders_profile=encoders_profile)
    assert "\n" not in str(e.value)


def test_disttrain_plans_one_group_per_tower(tmp_path, monkeypatch, planned):
    """``entrain train --system disttrain`` on the thinker: ``run_setups`` gives DistTrain-like's setup with
    one group per tower (the N-way search on its one profiled sample of the planner's profile, as
    ``simulate`` plans it) and each step's Plan is DistTrain-like's (1F1B, no deferral); the runtime
    trains such a plan exactly (tests/runtime/test_two_encoder_train.py)."""
    from dataclasses import replace

    from entrain.core.planning.encoders import search_encoders
    from entrain.core.planning.encoders_baselines import generate_disttrain_encoders_plan
    from entrain.runtime.planning import EncodersStepPlanner, run_encoders, run_setups
    from entrain.runtime.run_data import load_data
    from entrain.sim.encoders_run import encoders_profile

    spec = _thinker_spec(monkeypatch, planned[0], tmp_path / "run", "--system", "disttrain")
    cost = spec.model.cost_model()
    batches = load_data(spec, cost).train
    setup = run_setups(spec, cost, batches, 3, encoders_profile=encoders_profile)["disttrain"]
    assert setup.source.startswith("DistTrain-like N-encoder (vision, audio), one profiled sample")
    assert setup.layout.encoder_names == ("vision", "audio") and setup.layout.world_size == 3
    encoders = run_encoders(spec)
    (one,) = setup.profile  # its one profiled sample
    assert setup.config == search_encoders([one], encoders, replace(spec.parallel, gpus=3))[0]
    plan = EncodersStepPlanner(encoders, setup.config, "disttrain", setup.layout)(0, batches[0])
    assert plan.system == "disttrain"
    assert all(mb.encoder_subs == mb.llm_subs for rep in plan.iterations[0].microbatches for mb in rep)
    assert plan == generate_disttrain_encoders_plan([batches[0]], encoders, setup.config)


def test_plan_writes_disttrains_groups_per_tower_as_train_plans_them(tmp_path, monkeypatch, planned):
    """``entrain plan --system disttrain --out`` on the thinker writes DistTrain-like's one group per tower
    (``runtime.planning.encoders_setup``, the rule ``train`` applies), the layout ``train --system disttrain``
    plans with its worker's planner callables; ``train --plan`` of the file plans every step as that run."""
    from entrain.runtime.planning import EncodersStepPlanner, run_encoders, run_setups
    from entrain.runtime.run_data import load_data

    folder, _, _ = planned
    path = tmp_path / "disttrain.json"
    assert (
        main(["plan", *_model(folder, []), "--gpus", "3", "--system", "disttrain", "--out", str(path)]) == 0
    )
    written = json.loads(path.read_text())
    assert written["system"] == "disttrain" and list(written["layout"]["components"]) == [
        "vision",
        "audio",
        "llm",
    ]
    named = [s["encoder"] for s in written["layout"]["stages"] if s["component"] == "encoder"]
    assert named == ["vision", "audio"] and written["source"].startswith(
        "DistTrain-like N-encoder (vision, audio)"
    )
    spec = _thinker_spec(monkeypatch, folder, tmp_path / "run", "--system", "disttrain")
    cost = spec.model.cost_model()
    batches = load_data(spec, cost).train
    setup = worker_setups(spec, cost, batches, 3)["disttrain"]
    assert setup.layout.to_json() == written["layout"] and setup.source == written["source"]
    argv = ["--plan", str(path), "--hardware", "cpu-tiny", "--steps", "2", "--out", str(tmp_path / "p")]
    spec = train_spec(monkeypatch, argv)
    system, from_file = next(iter(run_setups(spec, cost, batches, 3).items()))
    assert system == "disttrain" and from_file.layout == setup.layout
    encoders = run_encoders(spec)
    assert EncodersStepPlanner(encoders, from_file.config, system, from_file.layout)(0, batches[0]) == (
        EncodersStepPlanner(encoders, setup.config, system, setup.layout)(0, batches[0])
    )
