"""``benchmarks/results/omni.md`` is its own data rendered by ``benchmarks/omni.py`` (every number in its
tables comes from the JSON it carries), and the N-encoder rows name only the systems that path plans."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

REPORT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "omni.md"


@pytest.fixture(scope="module")
def omni(benchmarks_on_path):
    return importlib.import_module("omni")


def _data(text: str) -> dict:
    return json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0])


def test_the_report_is_its_data_rendered(omni, benchmarks_on_path):
    provenance = importlib.import_module("provenance")
    text = REPORT.read_text(encoding="utf-8")
    res = _data(text)
    assert provenance.stamped(omni.render(res), res["source"]) == text


def test_both_paths_hold_every_system_and_entrains_choice_is_its_rows(omni):
    """Every system appears on both paths (a row or its reason); Entrain's ``encoder towers`` decision
    prices its two rows and names the faster fitting one, which the ratios divide by."""
    for case in _data(REPORT.read_text(encoding="utf-8"))["cases"]:
        rows = [r["system"] for r in case["n_encoder"]["rows"]]
        assert rows[:2] == ["entrain", "disttrain"]
        assert set(rows) | set(case["n_encoder"]["not_built"]) == set(omni.SYSTEMS)
        assert all("vision PP" in r["config"] for r in case["n_encoder"]["rows"])
        assert {r["system"] for r in case["one_encoder"]["rows"]} == set(omni.SYSTEMS)
        d = case["towers"]
        ms = {name: omni.fitting_ms(case, p, "entrain") for p, name in omni.PATHS.items()}
        assert d["candidates"] == ms
        path = omni.chosen_path(case)
        assert omni.PATHS[path] == d["chosen"]
        best = min((n for n, v in ms.items() if v is not None), key=ms.__getitem__)
        past = ms[best] < ms[d["default"]] * (1.0 - d["margin"]) if ms[d["default"]] else True
        assert d["chosen"] == (best if past else d["default"])
