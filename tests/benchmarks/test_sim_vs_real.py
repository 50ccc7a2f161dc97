"""benchmarks/sim_vs_real.py covers the LLM-dominant set: the same synth -> plan ->
train chain, with the pixel cap on every step and Entrain planned with the two-resource assignment."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def sim_vs_real(benchmarks_on_path):
    return importlib.import_module("sim_vs_real")


def _argv(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


@pytest.mark.parametrize("dataset", ["chartqa", "text-heavy"])
def test_each_step_gets_the_case_flags(sim_vs_real, monkeypatch, tmp_path, dataset):
    case = sim_vs_real.CASES[dataset]
    calls = []

    def fake(*argv, quiet=True):
        calls.append(list(argv))
        if "--out" in argv and argv[0] == "plan":
            Path(_argv(list(argv), "--out")).write_text(json.dumps({"system": _argv(list(argv), "--system")}))

    monkeypatch.setattr(sim_vs_real, "_entrain", fake)
    sim_vs_real.synth(str(tmp_path / "ds"), case)
    paths = {s: str(tmp_path / f"plan_{s}.json") for s in sim_vs_real.SYSTEMS}
    for s in sim_vs_real.SYSTEMS:
        sim_vs_real.plan("data.json", "prof.json", s, paths[s], case)
    sim_vs_real.train("data.json", "prof.json", paths, str(tmp_path / "run"), 2, case)
    synth, plans, trains = calls[0], calls[1:3], calls[3:]
    assert _argv(synth, "--dataset") == dataset
    assert _argv(synth, "--num-samples") == str(case.config["num_samples"])
    pixels = str(224 * 224) if dataset == "text-heavy" else None
    for cmd in plans + trains:
        assert _argv(cmd, "--max-pixels") == pixels
    assignment = {_argv(cmd, "--system"): _argv(cmd, "--assignment") for cmd in plans}
    want = "two-resource" if dataset == "text-heavy" else None
    assert assignment == {"entrain": want, "1f1b": None}
    assert [_argv(cmd, "--microbatch-size") for cmd in plans] == [str(case.config["microbatch_size"])] * 2
    assert case.results == ("sim_vs_real" if dataset == "chartqa" else "sim_vs_real_text_heavy")


def test_text_only_encoder_phases_are_counted_not_pooled(sim_vs_real, monkeypatch, tmp_path):
    """A phase the simulator prices 0 ms (no encoder call for text-only samples) is listed apart, not
    pooled as a 100 % error; every other phase is paired."""
    from types import SimpleNamespace

    import entrain.core.costs.costmodel
    import entrain.core.ir.plan
    import entrain.sim.executor

    def rec(stage, mb, fwd, bwd):
        return {"rank": stage, "stage": stage, "mb": mb, "sub": 0, "fwd_ms": fwd, "bwd_ms": bwd,
                "fwd_cpu_ms": fwd, "bwd_cpu_ms": bwd}  # fmt: skip

    step = {"iteration_time_ms": 100.0, "cpu_ms": [50.0, 50.0],
            "stage_times": [rec(0, 0, 10.0, 20.0), rec(0, 1, 0.1, 0.05), rec(1, 0, 30.0, 60.0), rec(1, 1, 3.0, 6.0)]}  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(step) for _ in range(2)) + "\n")
    (tmp_path / "plan.json").write_text("{}")
    fwd = {(0, 0, 0): 11.0, (0, 1, 0): 0.0, (1, 0, 0): 33.0, (1, 1, 0): 3.0}
    bwd = {(0, 0, 0): 22.0, (0, 1, 0): 0.0, (1, 0, 0): 66.0, (1, 1, 0): 6.0}
    rep = SimpleNamespace(fwd_ms=fwd, bwd_ms=bwd, busy_ms={0: 33.0, 1: 108.0})
    sim = SimpleNamespace(replicas=[rep], iteration_time_ms=110.0)
    monkeypatch.setattr(entrain.core.costs.costmodel.CostModel, "load", staticmethod(lambda path: None))
    monkeypatch.setattr(entrain.core.ir.plan.Plan, "from_json", staticmethod(lambda d: None))
    monkeypatch.setattr(entrain.sim.executor, "simulate_plan", lambda plan, cost, **_: [sim, sim])
    got = sim_vs_real.compare(str(tmp_path), "profile.json")
    assert got["no_call_real_ms"] == [0.1, 0.05]
    assert sorted(got["stages"]["fwd"]) == [(3.0, 3.0), (10.0, 11.0), (30.0, 33.0)]
    assert sim_vs_real.errors(got["stages"]["fwd"] + got["stages"]["bwd"])["median_abs_pct"] == pytest.approx(
        10.0
    )
