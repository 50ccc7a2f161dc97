"""Each flag is defined once and every ``train`` flag is accounted for.

* a flag that two ``entrain`` subcommands (any of ``build_parser()``'s) define is ``common.SHARED_FLAGS``'
  one: one help text and one default everywhere, unless ``common.COMMAND_DEFAULTS`` /
  ``common.COMMAND_MEANINGS`` / ``common.COMMAND_OWN`` say why not;
* every ``train`` flag is recorded in the run's ``config.json`` (and so forwarded to the workers and
  to ``--config``) unless ``train.NOT_RECORDED`` says why, and is part of the resume fingerprint
  unless its config field's metadata (or ``config.FLAGS_WITHOUT_FIELD``) says why not;
* ``plan``, ``simulate``, ``assign`` and ``train`` read no flag from ``args`` after the RunConfig is built.
"""

from __future__ import annotations

import argparse
import ast
import pathlib

import pytest

RUN_COMMANDS = ("train", "plan", "simulate", "assign")


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every leaf subcommand of ``parser`` by its full name (``data stats``, ``bench paper``, ``train``)."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                full = f"{prefix} {name}".strip()
                found.update(_commands(sub, full) or {full: sub})
    return found


def _actions() -> dict[str, dict[str, argparse.Action]]:
    """``{command: {dest: action}}`` of every ``entrain`` subcommand (``build_parser()``)."""
    from entrain.cli.main import build_parser

    return {
        c: {a.dest: a for a in sub._actions if a.option_strings and a.dest != "help"}
        for c, sub in _commands(build_parser()).items()
    }


def shared_flag_mismatches(actions: dict[str, dict[str, argparse.Action]]) -> list[str]:
    """``dest: what differs`` for every flag two commands both define that is not ``SHARED_FLAGS``' one
    (its help, its default but for ``COMMAND_DEFAULTS``) or, for one that an ``add_*_args`` function
    defines, not alike in every command, unless ``COMMAND_MEANINGS`` / ``COMMAND_OWN``
    say why it is defined per command."""
    from entrain.cli.common import COMMAND_DEFAULTS, COMMAND_MEANINGS, COMMAND_OWN, SHARED_FLAGS, FlagSpec

    problems = []
    for dest in sorted(set().union(*actions.values())):
        having = {c: acts[dest] for c, acts in actions.items() if dest in acts}
        if len(having) < 2 or COMMAND_MEANINGS.get(dest):
            continue
        having = {c: a for c, a in having.items() if not COMMAND_OWN.get(c, {}).get(dest)}
        spec = SHARED_FLAGS.get(dest)
        if spec is None:  # one add_*_args function defines it: every command's copy alike
            first = next(iter(having.values()))
            spec = FlagSpec(tuple(first.option_strings), first.help, {"default": first.default})
        default = spec.options.get("default", False if spec.options.get("action") == "store_true" else None)
        own = {c for c in having if dest in COMMAND_DEFAULTS.get(c, {})}
        helps = [c for c, a in having.items() if a.help != spec.help]
        defaults = [c for c, a in having.items() if c not in own and a.default != default]
        where = "SHARED_FLAGS'" if dest in SHARED_FLAGS else f"{next(iter(having))}'s"
        if helps:
            problems.append(f"{dest}: help differs from {where} in {', '.join(helps)}")
        if defaults:
            problems.append(f"{dest}: default differs from {where} in {', '.join(defaults)}")
    return problems


def test_every_command_is_scanned():
    assert {"train", "plan", "data stats", "data check", "profile", "bench paper", "export"} <= set(
        _actions()
    )


def test_a_shared_flag_has_one_help_and_one_default():
    from entrain.cli.common import COMMAND_DEFAULTS, COMMAND_MEANINGS, COMMAND_OWN

    assert shared_flag_mismatches(_actions()) == []
    reasons = [why for per in (*COMMAND_DEFAULTS.values(),) for _, why in per.values()]
    reasons += list(COMMAND_MEANINGS.values()) + [why for per in COMMAND_OWN.values() for why in per.values()]
    assert all(len(why) > 20 for why in reasons)


def test_a_flag_redefined_with_other_help_or_default_is_caught():
    actions = _actions()
    actions["simulate"]["tp"] = argparse.Action(["--tp"], "tp", default=2, help="tp, reworded")
    actions["profile"]["seed"] = argparse.Action(["--seed"], "seed", default=0, help=None)
    actions["export"]["iterations"] = argparse.Action(["--iterations"], "iterations", default=20, help="x")
    actions["export"]["lr"] = argparse.Action(["--lr"], "lr", default=1e-3, help="AdamW peak learning rate")
    assert shared_flag_mismatches(actions) == [
        "iterations: help differs from SHARED_FLAGS' in export",
        "lr: help differs from train's in export",
        "seed: help differs from SHARED_FLAGS' in profile",
        "tp: help differs from SHARED_FLAGS' in simulate",
        "tp: default differs from SHARED_FLAGS' in simulate",
    ]


def unaccounted_train_flags(train_actions: dict[str, argparse.Action]) -> list[str]:
    """``dest: why`` for every ``train`` flag neither recorded (forwarded) and fingerprinted nor listed
    as deliberately left out, with a reason."""
    from entrain.cli.train_args import NOT_IN_CONFIG, NOT_RECORDED, run_flags
    from entrain.config import fingerprint_fields, fingerprint_keys

    recorded = run_flags(argparse.Namespace(**{d: a.default for d, a in train_actions.items()}))
    fields, keys = fingerprint_fields(), set(fingerprint_keys())
    problems = []
    for dest in train_actions:
        if dest not in recorded and len(NOT_RECORDED.get(dest, "")) < 20:
            problems.append(f"{dest}: not recorded in config.json (so not forwarded) and no reason why")
        meta = fields.get(dest)
        if meta is None:
            if len(NOT_IN_CONFIG.get(dest, "")) < 20:
                problems.append(f"{dest}: no RunConfig field and no reason in train.NOT_IN_CONFIG")
        elif dest not in keys and len(meta.get("why", "")) < 20:
            problems.append(
                f"{dest}: not fingerprinted and its field's metadata says no reason (not_fp(why))"
            )
    return problems


def test_every_train_flag_is_forwarded_and_fingerprinted_or_excluded_with_a_reason():
    from entrain.config import fingerprint_fields

    assert unaccounted_train_flags(_actions()["train"]) == []
    for name, meta in fingerprint_fields().items():  # every field says whether it is fingerprinted
        assert meta.get("fingerprint") in (True, "when-set") or len(meta.get("why", "")) > 20, name


def test_the_fingerprint_and_the_record_follow_the_field_metadata():
    from entrain.cli.train_args import run_flags
    from entrain.config import RunConfig
    from entrain.runtime.checkpointer import fingerprint

    actions = _actions()["train"]
    args = argparse.Namespace(**{d: a.default for d, a in actions.items()})
    args.model_path, args.decision_margin_pct, args.confine_images = "ckpt/vlm", 1.0, True
    spec = RunConfig.from_args(args)
    fp = fingerprint(spec, "entrain")
    assert fp["model_path"] == "ckpt/vlm" and fp["confine_images"] is True and fp["dp"] == 1
    assert "vision_model" not in fp and "deterministic" not in fp and "entrain_layout" not in fp
    assert run_flags(args)["model_path"] == "ckpt/vlm" and run_flags(args)["decision_margin_pct"] == 1.0


def test_a_new_train_flag_without_a_field_or_reason_is_caught():
    actions = dict(_actions()["train"])
    actions["brand_new"] = argparse.Action(["--brand-new"], "brand_new", default=1, help="nobody reviewed")
    assert "brand_new: no RunConfig field and no reason in train.NOT_IN_CONFIG" in unaccounted_train_flags(
        actions
    )


CLI = pathlib.Path(__file__).resolve().parents[2] / "entrain" / "cli"
BUILDS = ("from_args", "_spec", "spec_of")
"""Calls that build a command's configuration: ``RunConfig.from_args``, a command's request built from
the flags (``PlanRequest.from_args`` ...), ``train_args.spec_of`` (``train._spec``)."""
MODULES = {"train": ("train", "train_args", "train_worker", "launch")}
"""A command's modules under ``entrain/cli`` (default: the command's own)."""
READERS = {
    "plan": {"from_args": "builds the PlanRequest", "run": "hands the flags to PlanRequest.from_args"},
    "simulate": {"from_args": "builds the SimulateRequest", "simulate_systems": "benchmarks' entry point",
                 "run": "hands the flags to SimulateRequest.from_args"},
    "assign": {"run": "builds the AssignRequest"},
    "train": {
        "run": "--demo, --nproc and --dp before the config", "as_worker": "the same in a worker",
        "spec_of": "builds the config", "infer_dp": "--dp from the process count, before the config",
        "apply_demo": "--demo's values, before the config", "run_flags": "what config.json records",
        "child_argv": "forwards the recorded flags", "launch": "forwards the recorded flags",
        "relaunch_args": "forwards the recorded flags after a re-plan",
    },
}  # fmt: skip
"""Functions of each command that may read ``args`` (only before they build the configuration)."""


def args_reads_after_the_config(source: str, readers: dict[str, str]) -> list[str]:
    """``function:line`` of every use of ``args`` in a function not in ``readers``, or in one after the
    line that builds the configuration."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        uses = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == "args"]
        built = [
            n.lineno
            for n in ast.walk(fn)
            if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) in BUILDS
        ]
        after = [line for line in uses if built and line > min(built)]
        found += [f"{fn.name}:{line}" for line in (uses if fn.name not in readers else after)]
    return found


@pytest.mark.parametrize("command", sorted(READERS))
def test_a_command_reads_no_flag_from_args_after_its_config_is_built(command):
    found = []
    for module in MODULES.get(command, (command,)):
        source = (CLI / f"{module}.py").read_text()
        found += [f"{module}.{f}" for f in args_reads_after_the_config(source, READERS[command])]
    assert found == []


def test_an_args_read_after_the_config_is_caught():
    source = "def run(args):\n    config = RunConfig.from_args(args)\n    return go(config, args.seed)\n"
    assert args_reads_after_the_config(source, {"run": "builds it"}) == ["run:3"]
    source = "def _cost(args):\n    return resolve(args.model)\n"
    assert args_reads_after_the_config(source, {}) == ["_cost:2"]
