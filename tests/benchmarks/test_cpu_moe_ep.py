"""``benchmarks/cpu_moe_ep.py``'s pieces that need no training run: the ranks' cores a run used (its
``metrics.jsonl``'s per-rank CPU over the step's wall, first step dropped), the per-``ep`` profile of
``--profile`` (the closed loop), the joint refit's prediction beside the others in ``summarize``, the
recorded command without folder paths, and the report of a pass with and without the CPU records."""

from __future__ import annotations

import importlib

import pytest


@pytest.fixture
def moe(benchmarks_on_path):
    return importlib.import_module("cpu_moe_ep")


def test_ranks_cores_sums_the_ranks_cpu_over_the_steps_wall(moe):
    rows = [
        {"iteration_time_ms": 100.0, "cpu_ms": [400.0, 400.0, 400.0, 400.0]},  # first step: dropped
        {"iteration_time_ms": 100.0, "cpu_ms": [50.0, 40.0, 30.0, 20.0]},  # 1.4 cores
        {"iteration_time_ms": 200.0, "cpu_ms": [100.0, 100.0, 50.0, 50.0]},  # 1.5
        {"iteration_time_ms": 100.0, "cpu_ms": [10.0, 10.0, 10.0, 10.0]},  # 0.4
    ]
    assert moe.ranks_cores(rows) == pytest.approx(1.4)


def test_the_profile_of_each_ep(moe):
    assert moe.profile_for(None, 2) is None
    assert moe.profile_for("runs/cpu_moe_ep.ep{ep}.joint.json", 2) == "runs/cpu_moe_ep.ep2.joint.json"
    assert moe.profile_for("one.json", 1) == "one.json"


def test_summarize_adds_the_joint_refit_beside_the_refit(moe):
    per_round = [{"1": {"entrain": 80.0, "1f1b": 100.0}}, {"1": {"entrain": 90.0, "1f1b": 100.0}}]
    got = moe.summarize(
        per_round,
        {"1": {"entrain": 95.0, "1f1b": 100.0}},
        {"1": {"entrain": 70.0, "1f1b": 100.0}},
        joint={"1": {"entrain": 42.5, "1f1b": 50.0}},
    )["1"]
    assert got["real_ratio"] == pytest.approx(0.85)
    assert got["sim_rel_error"] == pytest.approx(0.95 / 0.85 - 1)
    assert got["refit_sim_rel_error"] == pytest.approx(0.70 / 0.85 - 1)
    assert got["joint_sim_ratio"] == pytest.approx(0.85) and got["joint_sim_rel_error"] == pytest.approx(0.0)
    assert got["joint_sim_ms"] == {"entrain": 42.5, "1f1b": 50.0}


def test_the_recorded_command_names_folders_not_paths(moe):
    src = {"commit": "abc", "command": "python benchmarks/cpu_pipeline.py --moe-ep --model-path /x/ckpt "
           "--keep-runs /x/runs --profile /x/runs/cpu_moe_ep.ep{ep}.joint.json --launches 5"}  # fmt: skip
    assert moe._command(src)["command"] == (
        "python benchmarks/cpu_pipeline.py --moe-ep --model-path DIR --keep-runs RUNS "
        "--profile RUNS/cpu_moe_ep.ep{ep}.joint.json --launches 5"
    )


def _pass(**more) -> dict:
    per_ep = {"1": {"ratios": [0.8, 0.9], "real_ratio": 0.85, "spread": [0.8, 0.9],
                    "median_ms": {"entrain": 85.0, "1f1b": 100.0}, "sim_ms": {"entrain": 86.0, "1f1b": 100.0},
                    "sim_ratio": 0.86, "sim_rel_error": 0.86 / 0.85 - 1, "within_tolerance": True}}  # fmt: skip
    return {"source": {"commit": "abc", "command": "python x"}, "rounds": 2, "steps": 5, "per_ep": per_ep,
            "busiestcpu_over_wall": [{"1": {"entrain": 0.5, "1f1b": 0.6}}] * 2,
            "plans": {"1": {"entrain": "p", "1f1b": "q"}}, **more}  # fmt: skip


def test_the_report_shows_the_cpu_the_ranks_had_and_the_planning_profile(moe):
    cores = [{"1": {"entrain": 1.6, "1f1b": 1.2}}, {"1": {"entrain": 1.8, "1f1b": 1.4}}]
    machine = [{"1": {"busy_cores": 1.9, "wall_s": 30.0}}, {"1": {"busy_cores": 2.0, "wall_s": 31.0}}]
    closed = moe.report(
        _pass(ranks_cores=cores, machine_cores=machine, planned_with="cpu_moe_ep.ep{ep}.joint.json")
    )
    row = next(x for x in closed.splitlines() if x.startswith("| 1 |"))
    assert row.endswith("| +1.2% | 0.50 / 0.60 | 1.70 / 1.30 | 1.95 |")
    assert "planned with cpu_moe_ep.ep{ep}.joint.json (the closed loop" in closed
    old = moe.report(_pass())  # a pass recorded before the CPU records
    assert next(x for x in old.splitlines() if x.startswith("| 1 |")).endswith("| 0.50 / 0.60 | - | - |")
    assert "planned with cpu-tiny." in old
    earlier = moe.report(_pass(earlier_passes=[_pass(planned_with="p.json")]))
    assert "steps, planned with p.json): ep 1: real 0.850 (0.800-0.900), sim 0.860, error +1.2%" in earlier
