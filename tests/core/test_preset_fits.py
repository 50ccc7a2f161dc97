"""The fitted presets read the numbers their fits wrote (``entrain/core/costs/fits/*.json``, written by
``benchmarks/fit_*.py``), and those are the numbers the fits' reports state: renewing a fit is running
its script, which writes both (``cpu-tiny``'s: ``tests/core/test_presets.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from entrain.core.costs import presets as P

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _report(name: str) -> str:
    return (RESULTS / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["a40_paper", "a40_fig4", "cpu_tiny"])
def test_each_fit_names_its_commit_and_command(name):
    fit = P.fitted(name)
    assert re.fullmatch(r"[0-9a-f]{7,40}", fit["source"]["commit"])
    assert fit["source"]["command"].startswith(f"python benchmarks/fit_{name}.py")


def test_a40_paper_is_its_fit_report():
    report = _report("a40_paper_fit.md")
    fit = P.fitted("a40_paper")
    assert f"- encoder: **{fit['encoder']:.4f}**" in report
    for model, eff in fit["llm"].items():
        assert f"- llm ({model}): **{eff:.4f}**" in report
    assert P.A40_PAPER_EFFICIENCY["encoder"] == fit["encoder"]
    assert {m: P.A40_PAPER_EFFICIENCY["llm"][m] for m in fit["llm"]} == fit["llm"]


def test_a40_fig4_is_its_fit_report():
    fit = P.fitted("a40_fig4")
    assert f"LLM efficiency **{fit['llm']}**, eager score-traffic rate **{fit['scores']}**" in _report(
        "a40_fig4_fit.md"
    )
    assert P.A40_FIG4_EFFICIENCY == {"llm": fit["llm"], "scores": fit["scores"]}
