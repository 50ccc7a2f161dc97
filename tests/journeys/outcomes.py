"""What each documented command promises, checked after it ran: ``CHECKS[subcommand]``.

Every command's output paths (``--out``, ``--plot``, ``--plot-dir``; ``bench paper``'s default report)
must exist, JSON files and ``--json`` output must parse; a command may promise more (``data synth``
its records, ``train`` a run folder recording the flags it was given, ``export`` folders that load).
A documented command whose subcommand has no entry here is not covered: the coverage test fails."""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

OUTPUT_FLAGS = ("--out", "--plot", "--plot-dir")
INPUT_FLAGS = ("--dataset", "--plan", "--profile", "--from-trace", "--also-trace", "--config")
DEFAULT_OUTPUTS = {
    "bench paper": ("benchmarks/results/paper_reproduction.md",),
    "train --demo": ("runs/demo",),
}


@dataclass
class Ran:
    subcommand: str
    argv: list[str]
    """The command as run (sizes reduced), program first."""
    folder: Path
    stdout: str


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


@functools.cache
def switches() -> frozenset[str]:
    """Every flag of every ``entrain`` command that takes no value (``--json``, ``--trace``)."""
    import argparse

    from entrain.cli.main import build_parser

    found: set[str] = set()
    parsers = [build_parser()]
    while parsers:
        for action in parsers.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers += action.choices.values()
            elif action.nargs == 0:
                found.update(action.option_strings)
    return frozenset(found)


def positionals(subcommand: str, argv: list[str]) -> list[str]:
    """The operands after the subcommand words (``data check PATH``, ``export RUN``)."""
    out, skip = [], False
    for word in argv[1 + len(subcommand.split()) :]:
        if skip:
            skip = False
        elif word.startswith("--"):
            skip = "=" not in word and word not in switches()
        else:
            out.append(word)
    return out


def outputs(subcommand: str, argv: list[str]) -> list[str]:
    found = [v for f in OUTPUT_FLAGS if (v := flag(argv, f))]
    key = "train --demo" if subcommand == "train" and "--demo" in argv and not found else subcommand
    return found or list(DEFAULT_OUTPUTS.get(key, ()))


def inputs(subcommand: str, argv: list[str]) -> list[str]:
    if argv[0] != "entrain":
        return []
    return [v for f in INPUT_FLAGS if (v := flag(argv, f))] + positionals(subcommand, argv)


def _files(ran: Ran) -> None:
    for path in outputs(ran.subcommand, ran.argv):
        target = ran.folder / path
        assert target.exists(), f"{' '.join(ran.argv)}: promised {path}, which is missing"
        if target.is_dir():
            assert any(target.iterdir()), f"{' '.join(ran.argv)}: {path} is empty"
        elif target.suffix == ".json":
            json.loads(target.read_text())
        else:
            assert target.stat().st_size > 0, f"{path} is empty"
    if "--json" in ran.argv:
        json.loads(ran.stdout)


def _synth(ran: Ran) -> None:
    _files(ran)
    records = json.loads((ran.folder / flag(ran.argv, "--out") / "data.json").read_text())
    assert len(records) == int(flag(ran.argv, "--num-samples") or len(records))


def _families(ran: Ran) -> None:
    from entrain.models.families.registry import family_names

    assert all(name in ran.stdout for name in family_names()), ran.stdout


def _python(ran: Ran) -> None:
    """``python -c CODE`` ran without raising (``run_python``): nothing more is promised."""


def _export(ran: Ran) -> None:
    from tests.journeys.loading import check_export

    _files(ran)
    check_export(ran.folder / positionals("export", ran.argv)[0], ran.folder / flag(ran.argv, "--out"))


def _train(ran: Ran) -> None:
    _files(ran)
    for run in run_folders(ran.folder / outputs("train", ran.argv)[0]):
        check_run_records(ran.argv, ran.folder, run)


def run_folders(out: Path) -> list[Path]:
    """``out`` for one system, else ``out/<system>`` per system."""
    if (out / "config.json").is_file():
        return [out]
    return sorted(p for p in out.iterdir() if (p / "config.json").is_file())


ASKED = {
    "--steps": ("steps", int),
    "--global-batch": ("global_batch", int),
    "--microbatch-size": ("microbatch_size", int),
    "--seed": ("seed", int),
    "--system": ("systems", lambda v: v.split(",")),
    "--model": ("model", str),
    "--model-path": ("model_path", os.path.normpath),
    "--vision-model": ("vision_model", os.path.normpath),
    "--llm-model": ("llm_model", os.path.normpath),
    "--out": ("out", os.path.normpath),
    "--plan": ("plan", os.path.normpath),
    "--dataset": ("dataset", os.path.normpath),
    "--profile": ("profile", os.path.normpath),
    "--lr": ("lr", float),
    "--precision": ("precision", str),
    "--max-pixels": ("max_pixels", int),
    "--freeze": ("freeze", lambda v: v.split(",")),
    "--checkpoint-every": ("checkpoint_every", int),
    "--trace": ("trace", bool),
    "--tensorboard": ("tensorboard", bool),
    "--resume": ("resume", bool),
}
"""A flag of the train line -> the ``config.json`` ``spec`` key that must record it."""


def check_run_records(argv: list[str], folder: Path, run: Path) -> None:
    """config.json, plan.json and metrics.jsonl record the settings the line asked for."""
    config = json.loads((run / "config.json").read_text())
    spec = config["spec"]
    for name, (key, parse) in ASKED.items():
        value = "1" if parse is bool and name in argv else flag(argv, name)
        if value is not None:
            recorded = os.path.normpath(spec[key]) if parse is os.path.normpath else spec[key]
            assert recorded == parse(value), f"{name} {value}: config.json records {key}={spec[key]!r}"
    if (config_path := flag(argv, "--config")) is not None:
        _check_config_file(argv, folder / config_path, spec)
    if (plan_path := flag(argv, "--plan")) is not None:
        planned = json.loads((folder / plan_path).read_text())
        assert spec["global_batch"] == planned["global_batch"] and config["system"] == planned["system"]
        assert spec["microbatch_size"] == planned["microbatch_size"]
    plan = json.loads((run / "plan.json").read_text())
    if plan_path is not None:
        assert plan["layout"] == planned["layout"], "the run's layout is not the plan's"
    assert not {"--trace"} & set(argv) or (run / "trace.json").is_file(), "--trace: no trace.json"
    assert "--tensorboard" not in argv or any((run / "tensorboard").iterdir()), (
        "--tensorboard: nothing written"
    )
    assert plan["system"] == config["system"] and config["system"] in spec["systems"]
    assert plan["layout"]["microbatch_size"] == spec["microbatch_size"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows if "step" in r and "loss" in r]
    assert steps == list(range(spec["steps"])), f"{run}/metrics.jsonl steps {steps}, asked {spec['steps']}"
    last = run / "checkpoints" / f"step-{spec['steps']:08d}" / "manifest.json"
    assert last.is_file(), f"{run}: no checkpoint of the last step ({last.parent.name})"
    first = next(r for r in rows if r.get("step") == config.get("resumed_from_step", 0))
    assert len(first["sample_ids"]) == spec["global_batch"] and math.isfinite(first["loss"])


def _check_config_file(argv: list[str], path: Path, spec: dict) -> None:
    """``--config FILE``: the run records each of the file's flags that the command line does not
    give (a TOML's keys, or a run's ``config.json`` ``flags``); never ``out`` from a run's config."""
    import tomllib

    text = path.read_text(encoding="utf-8")
    data = json.loads(text)["flags"] if path.suffix == ".json" else tomllib.loads(text)
    for key, value in data.items():
        name = "--" + key.replace("_", "-")
        if (
            name in argv
            or name not in ASKED
            or value in (None, "")
            or (path.suffix == ".json" and key == "out")
        ):
            continue
        spec_key, parse = ASKED[name]
        recorded = os.path.normpath(spec[spec_key]) if parse is os.path.normpath else spec[spec_key]
        expected = value if parse is bool else parse(str(value))
        assert recorded == expected, (
            f"--config {path.name}: {key}={value!r}, config.json records {spec_key}={spec[spec_key]!r}"
        )


CHECKS: dict[str, Callable[[Ran], None]] = {
    "data stats": _files,
    "data synth": _synth,
    "data check": _files,
    "data families": _families,
    "plan": _files,
    "assign": _files,
    "simulate": _files,
    "bench paper": _files,
    "profile": _files,
    "train": _train,
    "export": _export,
    "plot-trace": _files,
    "python -c": _python,
}
