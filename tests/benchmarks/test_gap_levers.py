"""benchmarks/gap_levers.py: each lever takes its term off Entrain's time, hand-computed on two cases; the
memory lever scales only the probed cases; the report marks the levers that reach the target."""

from __future__ import annotations

import importlib
import math

import pytest


def _case(name: str, best_ms: float, entrain_ms: float, bound_ms: float, **gap) -> dict:
    return {
        "case": name, "lists": ["zoo"], "best_fitting_baseline": "dflop", "bound_ms": bound_ms,
        "systems": {"dflop": {"iteration_time_ms": best_ms}, "entrain": {"iteration_time_ms": entrain_ms}},
        "entrain_gap": {"idle_ms": 0.0, "imbalance_ms": 0.0, "recompute_ms": 0.0, "overheads_ms": 0.0, **gap},
    }  # fmt: skip


def _res() -> dict:
    a = _case("a/1B", 120.0, 100.0, 60.0, idle_ms=20.0, imbalance_ms=10.0, recompute_ms=5.0)
    b = _case("b/1B", 150.0, 100.0, 50.0, idle_ms=10.0, imbalance_ms=30.0)
    head = {**_case("h/1B", 1.0, 1.0, 1.0), "lists": ["headline"]}  # not a zoo case: left out
    probe = {"preset": {"iteration_time_ms": 90.0}, "unlimited": {"iteration_time_ms": 60.0}}
    rows = [
        {"case": "a/1B", "contiguous_ms": 66.0},  # the best contiguous split leaves 6 of a's 10 ms
        {"case": "b/1B", "contiguous_ms": 80.0, "memory_probe": probe},  # leaves all of b's 30 ms
        {"case": "h/1B", "contiguous_ms": 1.0},
    ]
    return {"cases": [a, b, head], "layer_bound": {"cases": rows}}


def test_each_lever_takes_its_term_off_entrain_time(benchmarks_on_path):
    gap_levers = importlib.import_module("gap_levers")
    lv = gap_levers.levers(_res())

    def gm(x: float, y: float) -> float:
        return math.sqrt(x * y)

    assert lv["zoo_cases"] == 2 and lv["memory_probed"] == 1
    assert lv["achieved"] == pytest.approx(gm(1.2, 1.5))
    assert lv["idle"] == pytest.approx(gm(120 / 80, 150 / 90))
    assert lv["imbalance"] == pytest.approx(gm(120 / 90, 150 / 70))
    assert lv["imbalance beyond the best contiguous split"] == pytest.approx(gm(120 / 96, 150 / 100))
    assert lv["recompute"] == pytest.approx(gm(120 / 95, 150 / 100))
    assert lv["idle and imbalance"] == pytest.approx(gm(120 / 70, 150 / 60))
    assert lv["idle and imbalance beyond the best contiguous split"] == pytest.approx(gm(120 / 76, 150 / 90))
    assert lv["memory"] == pytest.approx(gm(1.2, 1.5 * 90 / 60))


def test_without_the_whole_layer_section_the_contiguous_levers_are_left_out(benchmarks_on_path):
    gap_levers = importlib.import_module("gap_levers")
    res = _res()
    del res["layer_bound"]
    lv = gap_levers.levers(res)
    assert not any(k.endswith("contiguous split") for k in lv)
    assert lv["memory_probed"] == 0 and lv["memory"] == pytest.approx(lv["achieved"])
    lines = gap_levers.render(lv, 1.25)
    assert "| no idle | 1.581 | yes |" in lines  # sqrt(1.5 * 150 / 90)
    assert "| no recompute | 1.376 | yes |" in lines
    assert "| none (achieved) | 1.342 | yes |" in lines
    assert gap_levers.render(lv, 1.5)[-1] == "| memory unlimited (the probed cases) | 1.342 | no |"
