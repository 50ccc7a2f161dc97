"""Journey: however ``entrain train --nproc 2`` is given its settings (flags, a ``--config`` TOML file,
a run folder's ``config.json``, ``--plan FILE``, ``--demo``), the worker processes train the run that
was asked: their argv, the run's ``config.json``, ``plan.json`` and ``metrics.jsonl`` all show it.

The real front process runs (``entrain.cli.main.main``); only torchrun is replaced: the argv the
launcher would hand it runs as forked gloo ranks (``tests/runtime/cli_ranks.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runtime.cli_ranks import run_ranks  # tests/runtime (tests/ is on sys.path)

from entrain.cli import launch
from entrain.cli.main import build_parser, main
from entrain.runtime.launcher import ERROR_DIR_ENV, worker_errors

ASKED = {"model": "tiny", "dataset": "skewed", "system": "1f1b", "encoder_stages": 1, "llm_stages": 1,
         "steps": 1, "global_batch": 4, "microbatch_size": 1, "seed": 3}  # fmt: skip
"""Every value differs from train's default (10 steps of 16 samples, seed 0, ``runs/train``)."""


PLANNED = ("model", "dataset", "system", "global_batch", "microbatch_size", "seed")
"""What ``entrain plan`` takes of ``ASKED`` (the plan file carries them, and the stages it chose)."""


def _flags(values: dict) -> list[str]:
    return [x for k, v in values.items() for x in ("--" + k.replace("_", "-"), str(v))]


@pytest.fixture
def workers(monkeypatch, tmp_path) -> list[list[str]]:
    """The argv of every worker group the launcher starts, run as 2 forked ranks instead of torchrun."""
    monkeypatch.chdir(tmp_path)  # a run with the defaults would train into ./runs/train: here
    started: list[list[str]] = []

    def start(argv: list[str], nproc: int) -> tuple[int, list[str]]:
        started.append(argv)
        errors = tmp_path / f"errors{len(started)}"
        errors.mkdir()
        ranks = tmp_path / f"ranks{len(started)}"
        results = run_ranks(["train", *argv], nproc, ranks, env={ERROR_DIR_ENV: str(errors)}, timeout_s=120)
        codes = [r.exitcode for r in results]
        assert None not in codes, [r.stderr[-2000:] for r in results]
        return next((c for c in codes if c), 0), worker_errors(str(errors))

    monkeypatch.setattr(launch, "_start_workers", start)
    return started


def _route(route: str, tmp_path: Path) -> list[str]:
    """``train`` argv asking for ``ASKED`` into ``tmp_path/run`` by ``route``."""
    out = str(tmp_path / "run")
    if route == "flags":
        return [*_flags(ASKED), "--out", out]
    if route == "toml":
        toml = tmp_path / "c2.toml"
        lines = [f"{k} = {json.dumps(v)}" for k, v in {**ASKED, "out": out}.items()]
        toml.write_text("\n".join(lines) + "\n")
        return ["--config", str(toml)]
    if route == "config.json":  # a run folder's, given back
        (tmp_path / "config.json").write_text(json.dumps({"spec": {}, "flags": {**ASKED, "out": out}}))
        return ["--config", str(tmp_path / "config.json")]
    if route == "plan":
        plan = str(tmp_path / "p.json")
        made = [
            "plan",
            "--gpus",
            "2",
            "--out",
            plan,
            *_flags({k: v for k, v in ASKED.items() if k in PLANNED}),
        ]
        assert main(made) == 0
        return ["--plan", plan, "--steps", "1", "--seed", "3", "--out", out]
    assert route == "demo"  # the demo's model, dataset and stages; the rest overridden
    return ["--demo", "--system", "1f1b", "--steps", "1", "--global-batch", "4", "--seed", "3", "--out", out]


@pytest.mark.parametrize("route", ["flags", "toml", "config.json", "plan", "demo"])
def test_the_workers_train_the_run_that_was_asked(workers, tmp_path, capsys, route):
    argv = ["train", "--nproc", "2", "--no-progress", *_route(route, tmp_path)]
    assert main(argv) == 0, capsys.readouterr().err
    (worker_argv,) = workers
    parsed = vars(build_parser().parse_args(["train", *worker_argv]))
    out = tmp_path / "run"
    plain = {k: v for k, v in ASKED.items() if not k.endswith("_stages")}  # a plan file carries the stages
    assert {k: parsed[k] for k in plain} == plain and parsed["out"] == str(out)
    config = json.loads((out / "config.json").read_text())
    spec = config["spec"]
    assert (spec["model"], spec["dataset"], spec["systems"], spec["seed"]) == ("tiny", "skewed", ["1f1b"], 3)
    assert (spec["steps"], spec["global_batch"], spec["microbatch_size"], spec["out"]) == (1, 4, 1, str(out))
    assert {k: config["flags"][k] for k in ("steps", "global_batch", "microbatch_size", "seed")} == {
        "steps": 1, "global_batch": 4, "microbatch_size": 1, "seed": 3,
    }  # fmt: skip
    assert config["world_size"] == 2 and len(config["layout"]["stages"]) == 2
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0] and len(rows[0]["sample_ids"]) == 4
    assert all(i.startswith("skewed-3-") for i in rows[0]["sample_ids"])  # drawn with --seed 3
    plan = json.loads((out / "plan.json").read_text())
    layout = plan["layout"]
    assert plan["system"] == "1f1b" and len(plan["iterations"]) == 1 and layout == config["layout"]
    assert layout["microbatch_size"] == 1 and len(plan["samples"]) == 4
    assert not (tmp_path / "runs").exists()
