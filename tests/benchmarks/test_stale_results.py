"""``benchmarks/regression.py``'s stale results: a results file whose ``Source: commit X`` line (or JSON
``commit``) is older than a commit to ``entrain/core`` or ``entrain/sim`` is listed, in a throw-away git
repository; a commit elsewhere lists nothing, and a commit that does not exist is listed as such."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from tests.benchmarks.fake_git import git as _git


@pytest.fixture(scope="module")
def regression(benchmarks_on_path):
    return importlib.import_module("regression")


def _commit(repo: Path, path: str, text: str) -> str:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    _git(repo, "add", path)
    _git(repo, "commit", "-qm", f"change {path}")
    return _git(repo, "rev-parse", "--short", "HEAD")


def test_a_results_file_older_than_the_simulated_code_is_listed(regression, tmp_path):
    _git(tmp_path, "init", "-q")
    measured = _commit(tmp_path, "entrain/core/ir/plan.py", "X = 1\n")
    results = tmp_path / "results"
    results.mkdir()
    (results / "a.md").write_text(f"# A\n\nSource: commit {measured}, `python benchmarks/a.py`\n")
    (results / "b.json").write_text(json.dumps({"commit": f"{measured}+dirty", "rows": []}))
    (results / "c.md").write_text("# no source line: not the stale check's to judge\n")
    (results / "regression_baseline.json").write_text(json.dumps({"commit": measured}))
    (results / "d.md").write_text("Source: commit deadbee, `python x.py`\n")

    def stale() -> dict:
        return {s["file"]: s["changed_by"] for s in regression.stale_results(results, tmp_path)}

    assert stale() == {"results/d.md": None}
    _commit(tmp_path, "entrain/runtime/run.py", "Y = 1\n")  # not the simulated code
    _commit(tmp_path, "docs/x.md", "text\n")
    assert stale() == {"results/d.md": None}
    core = _commit(tmp_path, "entrain/sim/engine.py", "Z = 1\n")
    assert stale() == {"results/a.md": [core], "results/b.json": [core], "results/d.md": None}
    lines = regression.stale_lines(regression.stale_results(results, tmp_path))
    assert (
        f"- results/a.md (commit {measured}): 1 commit(s) to entrain/core or entrain/sim since (newest: {core})"
        in lines
    )
    assert "- results/d.md (commit deadbee): not a commit of this repository" in lines


def test_the_run_report_lists_the_stale_files(regression):
    base = {"settings": {"iterations": 3, "seed": 0}, "commit": "x", "cases": {}}
    run = {"commit": "y", "wall_s": 1.0, "cases": {}, "stale_results": [
        {"file": "benchmarks/results/a.md", "commit": "abc1234", "changed_by": ["def5678"]}]}  # fmt: skip
    text = regression.render(base, run, [], 0)
    assert "## Results files older than the code they measure" in text
    assert (
        "- benchmarks/results/a.md (commit abc1234): 1 commit(s) to entrain/core or entrain/sim since" in text
    )
    assert "- none" in regression.render(base, {**run, "stale_results": []}, [], 0)
