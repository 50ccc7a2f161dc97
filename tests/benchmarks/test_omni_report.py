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


def test_the_n_encoder_path_plans_entrain_and_disttrain_only(omni):
    for case in _data(REPORT.read_text(encoding="utf-8"))["cases"]:
        assert [r["system"] for r in case["n_encoder"]["rows"]] == ["entrain", "disttrain"]
        assert set(case["n_encoder"]["not_built"]) == {"entrain-1f1b", "1f1b", "dip", "dip-greedy"}
        assert {r["system"] for r in case["one_encoder"]["rows"]} == set(omni.SYSTEMS)
        mine = omni.fitting_ms(case, "n_encoder", "entrain")
        assert mine and all("vision PP" in r["config"] for r in case["n_encoder"]["rows"])
