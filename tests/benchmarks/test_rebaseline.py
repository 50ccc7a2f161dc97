"""``benchmarks/regression.py --rebaseline`` on a tiny fake baseline in a throw-away git repository: it
names every row that moves (within the tolerance too) in the proposed commit message, and it refuses
while code differs from HEAD or the run is older than the code (a baseline never shares a commit with
code). The full regression is never run here."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import pytest

from tests.benchmarks.fake_git import git as _git

BASELINE = "benchmarks/results/regression_baseline.json"


@pytest.fixture(scope="module")
def regression(benchmarks_on_path):
    return importlib.import_module("regression")


def _run(commit: str, **systems: tuple[float, bool]) -> dict:
    got = {n: {"iteration_time_ms": ms, "fits_memory": fits} for n, (ms, fits) in systems.items()}
    return {"commit": commit, "wall_s": 1.0, "settings": {}, "cases": {"c/1B": {"systems": got}}}


OLD = _run("0000000", entrain=(1000.0, True), disttrain=(1200.0, True), dip=(1500.0, False))


def test_the_message_names_every_row_that_moves(regression):
    new = _run("abc1234", entrain=(1000.4, True), disttrain=(1200.0, True), dip=(1500.0, True))
    moved, message = regression.rebaseline_message(OLD, new, "because")
    assert [(r["case"], r["system"]) for r in moved] == [("c/1B", "entrain"), ("c/1B", "dip")]
    assert message.splitlines()[0] == "regression baseline re-recorded at abc1234: 2 of 3 rows move"
    assert "- c/1B entrain: 1000.000 -> 1000.400 ms (ratio 1.000400, ok)" in message  # within the tolerance
    assert "- c/1B dip: 1500.000 -> 1500.000 ms (ratio 1.000000, ok)" in message  # the fit moved
    assert "Every other row (1) is identical to the old baseline." in message
    assert "Why: because" in message


def test_a_case_present_on_one_side_only_moves(regression):
    new = _run("abc1234", entrain=(1000.0, True), disttrain=(1200.0, True), dip=(1500.0, False))
    new["cases"] = {"d/3B": new["cases"]["c/1B"]}
    moved, message = regression.rebaseline_message(OLD, new, "why")
    assert [(r["case"], r["verdict"]) for r in moved] == [("d/3B", "missing")]
    assert "- c/1B: in the old baseline, not in the run" in message


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "entrain" / "core").mkdir(parents=True)
    (tmp_path / BASELINE).write_text(json.dumps(OLD))
    (tmp_path / "entrain" / "core" / "a.py").write_text("X = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "code and baseline")
    return tmp_path


def _rebaseline(regression, repo: Path, run: dict) -> int:
    msg = repo / "benchmarks" / "results" / "REBASELINE_MSG.txt"
    return regression.rebaseline(repo / BASELINE, OLD, run, "why", print, repo=repo, msg_path=msg)


def test_it_refuses_while_code_is_uncommitted_and_then_writes_baseline_and_message(regression, repo, capsys):
    head = _git(repo, "rev-parse", "--short", "HEAD")
    new = _run(head, entrain=(990.0, True), disttrain=(1200.0, True), dip=(1500.0, False))
    (repo / "entrain" / "core" / "a.py").write_text("X = 2\n")
    assert regression.uncommitted_outside(repo=repo) == ["entrain/core/a.py"]
    assert _rebaseline(regression, repo, new) == 3
    assert "uncommitted changes outside the baseline: entrain/core/a.py" in capsys.readouterr().out
    assert json.loads((repo / BASELINE).read_text()) == OLD
    assert not (repo / "benchmarks" / "results" / "REBASELINE_MSG.txt").exists()

    _git(repo, "checkout", "-q", "--", "entrain/core/a.py")
    (repo / BASELINE).write_text("{}")  # the baseline's own file may differ
    assert _rebaseline(regression, repo, new) == 0
    out = capsys.readouterr().out
    assert "moved  c/1B entrain: 1000.000 -> 990.000 ms (ratio 0.990000, faster)" in out
    assert "git commit -F benchmarks/results/REBASELINE_MSG.txt -- " + BASELINE in out
    assert json.loads((repo / BASELINE).read_text())["cases"] == new["cases"]
    message = (repo / "benchmarks" / "results" / "REBASELINE_MSG.txt").read_text()
    assert "1 of 3 rows move" in message and "c/1B entrain: 1000.000 -> 990.000" in message


def test_it_refuses_a_run_older_than_the_code_or_on_a_dirty_tree(regression, repo, capsys):
    old_head = _git(repo, "rev-parse", "--short", "HEAD")
    (repo / "entrain" / "core" / "a.py").write_text("X = 3\n")
    _git(repo, "commit", "-qam", "code")
    new_head = _git(repo, "rev-parse", "--short", "HEAD")
    for commit, why in [(old_head, f"older than the code: {new_head} changed it"),
                        (new_head + "+dirty", "not at a commit"), ("deadbee", "not in this repository")]:  # fmt: skip
        assert _rebaseline(regression, repo, _run(commit, entrain=(1.0, True))) == 3
        assert why in capsys.readouterr().out
    assert json.loads((repo / BASELINE).read_text()) == OLD


def test_the_report_is_re_rendered_against_the_new_baseline(regression, repo, capsys):
    """After a rebaseline the report compares the run with the baseline it became: every row ok, none
    "faster" (a report left compared with the old baseline disagrees with its own JSON)."""
    head = _git(repo, "rev-parse", "--short", "HEAD")
    new = _run(head, entrain=(990.0, True), disttrain=(1200.0, True), dip=(1500.0, False))
    new["settings"] = OLD["settings"] = regression._settings(1, 0)
    assert _rebaseline(regression, repo, new) == 0
    out = repo / "benchmarks" / "results" / "regression.md"
    args = argparse.Namespace(baseline=repo / BASELINE, out=out, note="")
    assert regression._rerender(args, new, print) == 0
    report = out.read_text()
    assert "PASS" in report and "faster" not in report
    assert "| c/1B | entrain | 990.0 | 990.0 | 1.0000 | ok |" in report
