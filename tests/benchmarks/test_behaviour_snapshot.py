"""``benchmarks/behaviour_snapshot.py``'s own logic on hand-made captures (no command is run): which
fields it treats as run-dependent, how it hides temporary folders, what counts as a difference, and
that it walks every command of an argparse tree."""

from __future__ import annotations

import argparse
import importlib

import pytest


@pytest.fixture(scope="module")
def snap(benchmarks_on_path):
    return importlib.import_module("behaviour_snapshot")


ROOTS = {"/tmp/behaviour-x/tmp-HEAD": "<tmp>", "/tmp/behaviour-x": "<tmp>", "/tmp/behaviour-x/tree": "<tree>"}


def _capture(json_by_command: dict, helps: dict | None = None) -> dict:
    return {
        "help": helps or {"entrain": "usage: entrain\n"},
        "json": {name: {"exit": 0, "json": doc} for name, doc in json_by_command.items()},
    }


def test_run_dependent_fields_and_folders_are_normalised_and_nothing_else(snap):
    doc = {
        "wall_s": 1.5,
        "out": "/tmp/behaviour-x/tmp-HEAD/plan.json",
        "run": "/tmp/behaviour-x/shared/run",
        "code": "/tmp/behaviour-x/tree/entrain/x.py",
        "fits": [{"ms": [1.0, 2.0], "r2": 0.9, "tokens": [8, 16]}],
        "iteration_ms": 12.5,
    }
    got = snap.normalised(_capture({"plan": doc, "profile measured": doc}), ROOTS)["json"]
    plan, measured = got["plan"]["json"], got["profile measured"]["json"]
    assert plan["wall_s"] == measured["wall_s"] == "<run-dependent>"
    assert plan["out"] == "<tmp>/plan.json" and plan["run"] == "<tmp>/shared/run"
    assert plan["code"] == "<tree>/entrain/x.py"  # the longer root wins over its parent folder
    assert plan["fits"] == doc["fits"] and plan["iteration_ms"] == 12.5  # a simulated number is kept
    # measured times are run-dependent only in the command that measures them
    assert measured["fits"] == [{"ms": "<run-dependent>", "r2": "<run-dependent>", "tokens": [8, 16]}]


def test_a_changed_number_a_missing_key_and_a_changed_help_are_each_reported(snap):
    before = _capture({"plan": {"a": {"b": [1, 2]}, "gone": 1}}, {"entrain plan": "x\ny\n"})
    after = _capture({"plan": {"a": {"b": [1, 3]}, "new": True}}, {"entrain plan": "x\nz\n"})
    diffs = snap.differences(before, after)
    assert "json plan: json.a.b[1]: 2 -> 3" in diffs
    assert (
        'json plan: json.gone: 1 -> "<absent>"' in diffs
        and 'json plan: json.new: "<absent>" -> true' in diffs
    )
    (help_diff,) = [d for d in diffs if d.startswith("help entrain plan:")]
    assert "-y" in help_diff.splitlines() and "+z" in help_diff.splitlines()
    assert len(diffs) == 4


def test_same_captures_have_no_difference_and_a_lost_command_or_json_is_one(snap):
    cap = _capture({"plan": {"a": 1.0}}, {"entrain": "u\n", "entrain plan": "p\n"})
    assert snap.differences(cap, cap) == []
    fewer = _capture({"plan": {"a": 1.0}}, {"entrain": "u\n"})
    assert snap.differences(cap, fewer) == ["help entrain plan: only before"]
    failed = {"help": cap["help"], "json": {"plan": {"exit": 2, "json_error": "Expecting value"}}}
    assert snap.differences(cap, failed) == ["json plan: exit 0 -> 2, None -> Expecting value"]


def test_every_command_of_the_tree_is_walked(snap):
    root = argparse.ArgumentParser(prog="entrain")
    sub = root.add_subparsers()
    data = sub.add_parser("data").add_subparsers()
    data.add_parser("stats")
    data.add_parser("check")
    sub.add_parser("plan")
    assert snap.command_paths(root) == [(), ("data",), ("data", "stats"), ("data", "check"), ("plan",)]


def test_every_invocation_asks_for_json_and_names_a_known_command(snap):
    from entrain.cli.main import build_parser

    paths = {" ".join(p) for p in snap.command_paths(build_parser())}
    for name, argv in snap.INVOCATIONS.items():
        assert "--json" in argv, name
        assert " ".join(a for a in argv[:2] if not a.startswith(("-", "{"))) in paths, name
