"""Every headline number in README.md, docs/*.md and benchmarks/results/*.md names where it came from,
and the headline numbers are recomputed from the committed results they quote.

* A claim block carries a line ``Source: commit abc1234, `command` `` naming a commit of this
  repository (``git cat-file``) and the command that produced its numbers. Claim blocks: every
  ``benchmarks/results/*.md`` report, and every README/docs section (heading to heading) that quotes a
  benchmark (cites a ``benchmarks/`` script or results file, or ``entrain bench paper``) and states a
  measured number (a ratio ``1.23x``, a percentage, ``n/m`` cases, milliseconds).
* The README's and docs' headline numbers are recomputed from the JSON they quote, at their rounding.
* ``replan.md`` and ``regression.md`` are rendered again from their JSON by their own scripts: every
  number in them, and their Source lines, come from the committed JSON.
* ``slow``: the regression's headline case, re-run at the commit ``regression.json`` names (an
  exported copy), gives the times the report states.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TEXTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REPORTS = sorted(RESULTS.glob("*.md"))
FASTER = "faster than every baseline"
SOURCE = re.compile(r"Source: commit ([0-9a-f]{7,40}), `([^`]+)`")
CITES = re.compile(r"benchmarks/(?:results/)?[\w.-]+\.(?:py|md|json)|entrain bench paper")
MEASURED = re.compile(r"\d\.\d+ ?x\b|\d ?%|\b\d+/\d+\b|\d ms\b")
HEADLINE_CASE = "synthchartnet/1B/a40-paper/seed3"


def _flat(path: Path) -> str:
    return " ".join(path.read_text(encoding="utf-8").split())  # line breaks as spaces


def _json(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def _quoted(path: Path, pattern: str) -> re.Match:
    found = re.search(pattern, _flat(path))
    assert found, f"{path.name}: no sentence matches {pattern!r}"
    return found


def sections(text: str) -> list[str]:
    """A markdown text cut at its headings (fenced code blocks dropped: a ``#`` there is no heading)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.split(r"\n(?=#{1,6} )", text)


def claim_sections(text: str) -> list[str]:
    return [s for s in sections(text) if CITES.search(s) and MEASURED.search(s)]


def missing_commits(commits: set[str]) -> set[str]:
    """The names in ``commits`` that are no commit in ``git log`` (the history of HEAD)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the Source lines' commits cannot be looked up")
    history = subprocess.run(
        ["git", "rev-list", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    hashes = history.stdout.split()
    return {c for c in commits if not any(h.startswith(c) for h in hashes)}


@pytest.fixture(scope="module")
def benchmarks_path():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        yield
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


# --- every claim names its source ------------------------------------------------------------------------
@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.name)
def test_every_results_report_names_its_source(path):
    assert SOURCE.search(path.read_text(encoding="utf-8")), (
        f"{path.name}: no 'Source: commit abc1234, `command`' line (which code and command made these numbers?)"
    )


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.name)
def test_every_section_quoting_a_benchmark_names_its_source(path):
    bare = [
        s.splitlines()[0][:80]
        for s in claim_sections(path.read_text(encoding="utf-8"))
        if not SOURCE.search(s)
    ]
    assert not bare, f"{path.name}: sections quoting measured numbers without a Source line: {bare}"


def test_every_source_names_a_commit_of_this_repository():
    named = {
        (p.name, c) for p in [*TEXTS, *REPORTS] for c, _ in SOURCE.findall(p.read_text(encoding="utf-8"))
    }
    unknown = missing_commits({c for _, c in named})
    assert not unknown, (
        f"Source lines name commits not in git log: {sorted(n for n in named if n[1] in unknown)}"
    )


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.name)
def test_every_cited_results_file_exists(path):
    cited = set(re.findall(r"benchmarks/results/([\w.-]+\.\w+)", path.read_text(encoding="utf-8")))
    missing = sorted(name for name in cited if not (RESULTS / name).is_file())
    assert not missing, f"{path.name} cites missing results files: {missing}"


# --- the headline numbers, recomputed ----------------------------------------------------------------------
def _met(paper: dict, target: str) -> tuple[int, int]:
    rows = [t for t in paper["targets"] if t["target"] == target]
    return sum(t["met"] for t in rows), len(rows)


def test_readme_headline_is_the_committed_paper_reproduction():
    paper = _json("paper_reproduction.json")
    got = _quoted(
        ROOT / "README.md",
        r"measures Entrain faster than every baseline in (\d+)/(\d+) cases and the paper's Entrain "
        r"without these extensions in (\d+)/(\d+); DistTrain takes ([\d.]+)-([\d.]+)x Entrain's time "
        r"under `a40-paper`",
    ).groups()
    ratios = [
        c["systems"]["disttrain"]["iteration_time_ms"] / c["systems"]["entrain"]["iteration_time_ms"]
        for c in paper["cases"]
        if c["hardware"] == "a40-paper"
    ]
    want = (
        *_met(paper, f"Entrain {FASTER}"),
        *_met(paper, f"Entrain (paper: no extensions) {FASTER}"),
        f"{min(ratios):.2f}",
        f"{max(ratios):.2f}",
    )
    want = tuple(str(w) for w in want)
    assert got == want, f"README quotes {got}, paper_reproduction.json gives {want}: update the README"


def test_the_code_state_the_readme_names_is_the_reports():
    """The commit the README names for the paper reproduction is the one the report and its Source line
    name: a regenerated report (another commit, or none) fails here until the README follows."""
    named = _quoted(
        ROOT / "README.md", r"`benchmarks/results/paper_reproduction\.md` \(simulated at ([0-9a-f]{7})"
    )[1]
    report = (RESULTS / "paper_reproduction.md").read_text(encoding="utf-8")
    assert f"simulated on {named}" in report, (
        f"README names {named}; the report does not say it was simulated on it"
    )
    assert named in [c for c, _ in SOURCE.findall(report)], (
        f"paper_reproduction.md's Source line does not name {named}"
    )


def test_planner_doc_b_min_range_is_the_committed_paper_reproduction():
    cases = _json("paper_reproduction.json")["cases"]
    low, high, llava = _quoted(
        ROOT / "docs" / "planner.md",
        r"every `bench paper` case now converges with `b_min` between (\d+) and (\d+); the LLaVA \+ 3B "
        r"`a40-flops` case above converges at (\d+)",
    ).groups()
    assert all(c["b_min_converged"] for c in cases)
    (case,) = [
        c
        for c in cases
        if (c["dataset"], c["model"], c["hardware"]) == ("llava150k", "qwen25vl-llama3-3b", "a40-flops")
    ]
    b_mins = [c["b_min"] for c in cases]
    want = (min(b_mins), max(b_mins), case["b_min"])
    assert (int(low), int(high), int(llava)) == want, f"docs/planner.md: paper_reproduction.json gives {want}"


def _passes(results: dict, *labels: str) -> list[dict]:
    rows = [r for k, r in results.items() if any(k.endswith(f"({label})") for label in labels)]
    assert len(rows) == 4 * len(labels), f"cpu_pipeline_paired.json: {labels} should hold 4 workloads each"
    return rows


def test_readme_real_runs_are_the_committed_paired_passes():
    """README's real-run sentence: Entrain / 1F1B over the two final passes (calibrated preset, split
    decided), the simulator's error on them, and the analytic preset's on the receives-ahead pass."""
    results = _json("cpu_pipeline_paired.json")["results"]
    got = _quoted(
        ROOT / "README.md",
        r"iteration time was ([\d.]+)-([\d.]+)x 1F1B's on four workloads .*? put that ratio ([\d.]+)-([\d.]+) % "
        r"too low; from the analytic preset before that fit, (\d+)-(\d+) % too low",
    ).groups()
    final = _passes(results, "calibrated preset", "split decided")
    real = [r["real_ratio"] for r in final]
    low = [-100 * r["sim_rel_error"] for r in final]
    analytic = [-100 * r["sim_rel_error"] for r in _passes(results, "receives ahead")]
    want = (f"{min(real):.2f}", f"{max(real):.2f}", f"{min(low):.1f}", f"{max(low):.1f}",
            f"{min(analytic):.0f}", f"{max(analytic):.0f}")  # fmt: skip
    assert got == want, f"README quotes {got}, cpu_pipeline_paired.json gives {want}"


def _exhaustive_ceiling(case: dict) -> float:
    """replan_ceiling's mean row: the better static plan's mean / the mean of each phase's best split."""
    mean = {k: sum(r[k]["ms"] for r in case["phases"].values()) for k in ("first phase", "whole mix", "best")}
    return min(mean["first phase"], mean["whole mix"]) / mean["best"]


def test_workloads_doc_replan_numbers_are_the_committed_replan_run(benchmarks_path):
    """docs/workloads.md's curriculum paragraph: adaptive Entrain / the better static plan per model and the
    exhaustive ceiling, from replan.json, and its Source lines name the simulation's and the ceiling's commits."""
    replan, data = importlib.import_module("replan"), _json("replan.json")
    got = _quoted(
        ROOT / "docs" / "workloads.md",
        r"adaptive Entrain is ([\d.]+)x the better static plan for 1B .*? and ([\d.]+)x for 3B.*?exhaustive "
        r"ceiling over every split[^:]*: ([\d.]+)x / ([\d.]+)x\)\. Source: commit ([0-9a-f]+), `[^`]+` "
        r"Source: commit ([0-9a-f]+),",
    ).groups()
    ratio = {c["model"]: replan._better_static(c)[1] / replan._adaptive(c)["mean_ms"] for c in data["cases"]}
    ceiling = {c["model"]: _exhaustive_ceiling(c) for c in data["ceiling"]["cases"]}
    want = (f"{ratio['1B']:.3f}", f"{ratio['3B']:.3f}", f"{ceiling['1B']:.3f}", f"{ceiling['3B']:.3f}",
            data["source"]["commit"], data["ceiling"]["source"]["commit"])  # fmt: skip
    assert got == want, f"docs/workloads.md quotes {got}, replan.json gives {want}"


# --- generated reports: rendered again from their JSON -------------------------------------------------------
def test_replan_report_is_its_json_rendered(benchmarks_path):
    replan = importlib.import_module("replan")
    data = _json("replan.json")
    assert (RESULTS / "replan.md").read_text(encoding="utf-8") == replan.render(data), (
        "replan.md is not what benchmarks/replan.py renders from replan.json: regenerate it (--merge)"
    )
    assert {"commit", "command"} <= set(data["source"]) and {"commit", "command"} <= set(data["real"])


def test_regression_report_is_its_json_rendered(benchmarks_path):
    regression = importlib.import_module("regression")
    run, base = _json("regression.json"), regression.load_baseline()
    rows = regression.compare(base, run)
    want = regression.render(base, run, rows, regression.exit_status(rows), run.get("note", ""))
    assert (RESULTS / "regression.md").read_text(encoding="utf-8") == want, (
        "regression.md is not regression.json compared with today's baseline: re-render it "
        "(python benchmarks/regression.py --from benchmarks/results/regression.json)"
    )


@pytest.mark.slow
def test_the_regression_headline_case_reproduces_at_its_commit(tmp_path):
    """``benchmarks/regression.py --case`` (the headline command, every system) in a copy of the commit
    regression.json names gives the report's times at its rounding (0.1 ms)."""
    run = _json("regression.json")
    commit = str(run["commit"]).split("+")[0]
    assert not missing_commits({commit}), f"regression.json names {commit}, not a commit of this repository"
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True
    )
    (tmp_path / "tree.tar").write_bytes(archive.stdout)
    with tarfile.open(tmp_path / "tree.tar") as tar:
        tar.extractall(tmp_path / "tree", filter="data")
    tree = tmp_path / "tree"
    env = {**os.environ, "PYTHONPATH": str(tree), "REGRESSION_COMMIT": commit}
    done = subprocess.run(
        [sys.executable, "benchmarks/regression.py", "--case", HEADLINE_CASE, "--out", str(tmp_path / "r.md")],
        cwd=tree, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode in (0, 1, 2), done.stderr[-2000:]
    again = json.loads((tmp_path / "r.json").read_text())["cases"][HEADLINE_CASE]["systems"]
    stated = run["cases"][HEADLINE_CASE]["systems"]
    assert {n: f"{s['iteration_time_ms']:.1f}" for n, s in again.items()} == {
        n: f"{s['iteration_time_ms']:.1f}" for n, s in stated.items()
    }, f"{HEADLINE_CASE} at {commit} does not reproduce regression.json"
