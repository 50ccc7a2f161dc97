"""A synthesised LLaVA dataset (real chart images, real text), the
tiny model profiled on this CPU at tiny sizes, ``entrain plan --dataset llava.json --profile FILE``,
and ``entrain train --dataset llava.json --profile FILE`` (2 steps of Entrain on 1 encoder + 1 LLM
stage, the two ranks as forked gloo workers: no torchrun launch)."""

from __future__ import annotations

import json
import math

import pytest
from runtime.harness import run_workers

from entrain.cli.main import build_parser, main
from entrain.cli.train import _spec
from entrain.core.errors import ConfigError
from entrain.runtime.preflight import check_spec, world_size_of
from entrain.runtime.session import run_systems


def _train(env, spec):
    return [s.last_loss for s in run_systems(spec, env)]


def test_plan_and_train_from_a_llava_dataset_with_a_measured_profile(tmp_path, capsys):
    ds, prof, run = tmp_path / "ds", tmp_path / "tiny.json", tmp_path / "run"
    assert main(["data", "synth", "--dataset", "chartqa", "--num-samples", "8", "--out", str(ds)]) == 0
    data = ds / "data.json"
    ids = [r["id"] for r in json.loads(data.read_text())]
    argv = ["profile", "--model", "tiny", "--device", "cpu", "--tokens", "8,16,32", "--repeats", "1"]
    assert main([*argv, "--warmup", "0", "--out", str(prof)]) == 0
    capsys.readouterr()

    argv = ["plan", "--dataset", str(data), "--profile", str(prof), "--model", "tiny", "--gpus", "2"]
    plan_file = tmp_path / "plan.json"
    argv += ["--global-batch", "4", "--microbatch-size", "1", "--iterations", "2", "--out", str(plan_file)]
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["dataset"] == str(data) and plan["hardware"] == "profile-cpu"
    assert plan["predicted_iteration_time_ms"] > 0 and plan["gpus_per_replica"] <= 2
    assert json.loads(plan_file.read_text()) == plan  # --out writes what --json prints

    # train runs exactly that plan: its batch sizes apply (a contradicting --global-batch is an error)
    argv = [
        "train",
        "--dataset",
        str(data),
        "--profile",
        str(prof),
        "--model",
        "tiny",
        "--plan",
        str(plan_file),
    ]
    with pytest.raises(ConfigError, match="was made with --global-batch 4, but --global-batch 8 was given"):
        _spec(build_parser().parse_args([*argv, "--global-batch", "8"]))
    spec = _spec(build_parser().parse_args([*argv, "--steps", "2", "--out", str(run), "--no-progress"]))
    check_spec(spec)
    assert (
        world_size_of(spec) == 2 and spec.parallel.global_batch == 4 and spec.schedule.systems == ("entrain",)
    )
    losses = run_workers(_train, 2, tmp_path / "workers", spec)
    assert losses[0] == losses[1] and all(math.isfinite(x) and x > 0 for x in losses[0])

    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert {t["rank"] for r in rows for t in r["stage_times"]} == {0, 1}
    # wall and thread-CPU time per action (the profile's clock): both measured, CPU <= wall + slack
    for t in (t for r in rows for t in r["stage_times"]):
        assert t["fwd_cpu_ms"] > 0 and t["bwd_cpu_ms"] > 0
        assert t["fwd_cpu_ms"] <= t["fwd_ms"] * 1.05 + 1.0
    trained = json.loads((run / "plan.json").read_text())
    assert {s["id"] for s in trained["samples"]} <= set(ids) and len(trained["iterations"]) == 2
    assert trained["layout"] == plan["layout"] and trained["system"] == plan["system"]
    # the options the run planned with; the memory split off (a decision) leaves no trace in a Plan: only
    # the cuts of a split that happened are recorded (``schedules.entrain``)
    asked = {k: v for k, v in plan["schedule_options"].items() if (k, v) != ("memory_split", False)}
    assert trained["options"].items() >= asked.items()
    assert json.loads((run / "config.json").read_text())["spec"]["profile"] == str(prof)
