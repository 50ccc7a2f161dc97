"""The regression guard (benchmarks/regression.py): Entrain's simulated iteration time
on a few of the baseline's cases, the paper's headline command among them, is no more than 0.5 %
above ``benchmarks/results/regression_baseline.json``; the baseline covers exactly today's case
list; the verdict logic fails on Entrain slower (1) and on a baseline system slower (2)."""

from __future__ import annotations

import importlib

import pytest

FAST_CASES = (
    "synthchartnet/1B/a40-paper/seed3",  # the headline command
    "cocoqa/1B/a40-paper/seed0",  # a paper dataset
    "text-heavy/3B/a40-paper/seed0",  # a zoo workload on the 3B model
)
"""Entrain only, on the baseline's own settings: one cheap case of each kind (the whole guard is
``benchmarks/regression.py``, run before a change to core or sim lands; the zoo's docvqa, video and
mixture take minutes)."""


@pytest.fixture(scope="module")
def regression(benchmarks_on_path):
    return importlib.import_module("regression")


@pytest.fixture(scope="module")
def baseline(regression):
    return regression.load_baseline()


def test_the_baseline_holds_every_case_with_its_recorded_command(regression, baseline):
    s = baseline["settings"]
    every = regression.cases(s["iterations"], s["seed"])
    assert {k: (c["argv"], list(c["systems"])) for k, c in every.items()} == {
        k: (c["argv"], list(c["systems"])) for k, c in baseline["cases"].items()
    }
    assert sum("paper" in c["lists"] for c in every.values()) == 16
    assert sum("zoo" in c["lists"] for c in every.values()) == 20
    assert set(FAST_CASES) <= set(every) and "headline" in every[FAST_CASES[0]]["lists"]


@pytest.mark.parametrize("key", FAST_CASES)
def test_entrain_is_no_slower_than_its_baseline(regression, baseline, key):
    case = baseline["cases"][key]
    got = regression.run_case(case, systems=["entrain"])
    assert "error" not in got, got.get("error")
    row = regression.compare_system(key, "entrain", case["systems"]["entrain"], got["systems"]["entrain"])
    assert row["verdict"] not in regression.FAILS, (
        f"{key}: Entrain {row['current_ms']:.1f} ms vs baseline {row['baseline_ms']:.1f} ms "
        f"({row['ratio']:.4f}x, tolerance {regression.TOLERANCE:.1%})"
    )


def _run(systems: dict) -> dict:
    return {"cases": {"c": {"systems": {n: {"iteration_time_ms": ms, "fits_memory": fits}
                                        for n, (ms, fits) in systems.items()}}}}  # fmt: skip


BASE = {"entrain": (1000.0, True), "disttrain": (1200.0, True)}


@pytest.mark.parametrize(
    "current, status, verdicts",
    [
        (BASE, 0, ["ok", "ok"]),
        ({"entrain": (1004.0, True), "disttrain": (1205.0, True)}, 0, ["ok", "ok"]),
        ({"entrain": (1006.0, True), "disttrain": (1200.0, True)}, 1, ["slower", "ok"]),
        ({"entrain": (1000.0, True), "disttrain": (1300.0, True)}, 2, ["ok", "slower"]),
        ({"entrain": (1000.0, True), "disttrain": (1200.0, False)}, 2, ["ok", "lost fit"]),
        ({"entrain": (900.0, True), "disttrain": (1000.0, True)}, 0, ["faster", "faster"]),
        ({"disttrain": (1200.0, True)}, 1, ["missing", "ok"]),
    ],
)
def test_verdict(regression, current, status, verdicts):
    rows = regression.compare(_run(BASE), _run(current))
    assert [r["verdict"] for r in rows] == verdicts
    assert regression.exit_status(rows) == status


def _errored(message: str) -> dict:
    return {"cases": {"c": {"error": message}}}


@pytest.mark.parametrize(
    "base, current, verdict",
    [
        (_run(BASE), _errored("simulate failed"), "missing"),  # ran before, fails now
        (_errored("no memory fit"), _errored("another failure"), "missing"),  # fails otherwise now
        (_errored("no memory fit"), _run(BASE), "missing"),  # a case the baseline cannot compare
        (_errored("no memory fit"), _errored("no memory fit"), "ok"),  # the same known failure
    ],
)
def test_a_case_that_errors_is_ok_only_with_the_baselines_same_error(regression, base, current, verdict):
    rows = regression.compare(base, current)
    assert [(r["system"], r["verdict"]) for r in rows] == [("-", verdict)]
    assert regression.exit_status(rows) == (0 if verdict == "ok" else 1)
