"""The README's and docs/' quoted results match the committed results files (issue 21 req. 5).

Each figure is recomputed from the results JSON it quotes, so a re-run that moves it, or an edit of
the text alone, fails here; and every ``benchmarks/results/`` file the text points to exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TEXTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FASTER = "faster than every baseline"


def _paper() -> dict:
    return json.loads((RESULTS / "paper_reproduction.json").read_text(encoding="utf-8"))


def _met(paper: dict, target: str) -> tuple[int, int]:
    rows = [t for t in paper["targets"] if t["target"] == target]
    return sum(t["met"] for t in rows), len(rows)


def _quoted(path: Path, pattern: str) -> re.Match:
    text = " ".join(path.read_text(encoding="utf-8").split())  # line breaks as spaces
    found = re.search(pattern, text)
    assert found, f"{path.name}: no sentence matches {pattern!r}"
    return found


def test_readme_headline_is_the_committed_paper_reproduction():
    paper = _paper()
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


def test_planner_doc_b_min_range_is_the_committed_paper_reproduction():
    cases = _paper()["cases"]
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


def test_the_code_state_the_readme_names_is_the_results_files():
    """A commit the README names for the paper reproduction is the one its report names, so a
    regenerated report (which names another, or none) makes the README's sentence fail here."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    named = re.search(r"`benchmarks/results/paper_reproduction\.md` \(simulated at ([0-9a-f]{7})", text)
    if named:
        report = (RESULTS / "paper_reproduction.md").read_text(encoding="utf-8")
        assert f"simulated on {named[1]}" in report, (
            f"README names {named[1]}, the report does not: say which code the report was simulated on"
        )


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.name)
def test_every_cited_results_file_exists(path):
    cited = set(re.findall(r"benchmarks/results/([\w.-]+\.\w+)", path.read_text(encoding="utf-8")))
    missing = sorted(name for name in cited if not (RESULTS / name).is_file())
    assert not missing, f"{path.name} cites missing results files: {missing}"
