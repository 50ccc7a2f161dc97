"""The mixture-of-experts rows of the benchmarks: the workload zoo plans Qwen3-VL-30B-A3B with its degrees
(``ep`` included) searched, every other model at the zoo's DP 4, TP 2; ``cpu_moe_ep.summarize`` decides the
real ratio per ``ep`` on the paired per-round ratios (not a ratio of medians) and prices the simulator's
error against it."""

from __future__ import annotations

import importlib

import pytest


def test_zoo_searches_the_moe_models_degrees(benchmarks_on_path):
    zoo = importlib.import_module("workload_zoo")
    moe = zoo.case_argv("chartqa", "qwen3vl-30b-a3b", 3)
    dense = zoo.case_argv("chartqa", "qwen3vl-8b", 3)
    assert "--dp" not in moe and "--tp" not in moe and "--ep" not in moe
    assert dense[dense.index("--dp") + 1] == "4" and dense[dense.index("--tp") + 1] == "2"
    assert "qwen3vl-30b-a3b" in zoo.MODELS and zoo.FAMILY_DATASETS["qwen3vl-30b-a3b"]


def test_summarize_pairs_rounds_per_ep(benchmarks_on_path):
    moe = importlib.import_module("cpu_moe_ep")
    # ep 2: paired ratios 1.5, 1.0, 0.8 -> median 1.0; the ratio of medians would be 30 / 20 = 1.5
    per_round = [
        {"1": {"entrain": 50.0, "1f1b": 100.0}, "2": {"entrain": 30.0, "1f1b": 20.0}},
        {"1": {"entrain": 99.0, "1f1b": 110.0}, "2": {"entrain": 20.0, "1f1b": 20.0}},
        {"1": {"entrain": 200.0, "1f1b": 200.0}, "2": {"entrain": 40.0, "1f1b": 50.0}},
    ]
    sim = {"1": {"entrain": 94.0, "1f1b": 100.0}, "2": {"entrain": 10.0, "1f1b": 8.0}}
    got = moe.summarize(
        per_round, sim, {"1": {"entrain": 81.0, "1f1b": 100.0}, "2": {"entrain": 9.0, "1f1b": 9.0}}
    )
    assert got["1"]["ratios"] == pytest.approx([0.5, 0.9, 1.0])
    assert got["1"]["real_ratio"] == pytest.approx(0.9)
    assert got["1"]["spread"] == pytest.approx([0.5, 1.0])
    assert got["1"]["sim_ratio"] == pytest.approx(0.94)
    assert got["1"]["sim_rel_error"] == pytest.approx(0.94 / 0.9 - 1)
    assert got["1"]["within_tolerance"]
    assert got["2"]["ratios"] == pytest.approx([1.5, 1.0, 0.8])
    assert got["2"]["real_ratio"] == pytest.approx(1.0)
    assert got["2"]["sim_rel_error"] == pytest.approx(0.25) and not got["2"]["within_tolerance"]
    assert got["1"]["refit_sim_rel_error"] == pytest.approx(0.81 / 0.9 - 1)
    assert got["2"]["refit_sim_ratio"] == pytest.approx(1.0) and got["2"][
        "refit_sim_rel_error"
    ] == pytest.approx(0.0)


def test_the_zoo_header_names_the_rows_whose_degrees_were_searched(benchmarks_on_path):
    """The generic header's DP 4, TP 2 is not what the searched rows (``SEARCHED_DEGREES``) ran."""
    zoo = importlib.import_module("workload_zoo")

    def header(*models: str) -> str:
        cases = [{"dataset": "chartqa", "model": m, "iterations": 1, "error": "x"} for m in models]
        return zoo.render({"iterations": 1, "elapsed_s": 1.0, "cases": cases}).splitlines()[2]

    moe = zoo.MODELS["qwen3vl-30b-a3b"]
    assert "64 GPUs (DP 4, TP 2)" in header("1B", "3B")
    alone = header(moe)
    assert "DP 4, TP 2" not in alone and f"searched by each system's own method for the {moe} rows" in alone
    mixed = header("1B", moe)
    assert "DP 4, TP 2; DP, TP and `ep` searched" in mixed and moe in mixed
