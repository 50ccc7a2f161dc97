"""benchmarks/cpu_omni.py (``cpu_pipeline.py --omni``) without a training launch: it reads a run folder
(iteration times, per-rank CPU / wall, per-stage ms, losses and samples), decides the real ratio on the
paired per-round ratios, calls the losses equal only on the same samples within the tolerance, and
merges its pass into ``cpu_pipeline_paired.{md,json}`` as a section a later ``--paired`` pass keeps."""

from __future__ import annotations

import importlib
import json

import pytest


@pytest.fixture(scope="module")
def omni(benchmarks_on_path):
    return importlib.import_module("cpu_omni")


def write_run(folder, times, losses, cpu=((90.0, 45.0, 30.0),), encoder="vision"):
    """A run folder as ``entrain train`` writes it: ``metrics.jsonl`` (a row a step), ``plan.json``,
    ``config.json``."""
    folder.mkdir(parents=True)
    rows = []
    for step, (ms, loss) in enumerate(zip(times, losses)):
        stage_times = [
            {"rank": 0, "stage": 0, "mb": 0, "sub": 0, "fwd_ms": 10.0 * (step + 1), "bwd_ms": 5.0},
            {"rank": 0, "stage": 0, "mb": 1, "sub": 0, "fwd_ms": 1.0, "bwd_ms": 1.0},
            {"rank": 1, "stage": 1, "mb": 0, "sub": 0, "fwd_ms": 3.0, "bwd_ms": 4.0},
        ]
        rows.append({"step": step, "loss": loss, "iteration_time_ms": ms, "cpu_ms": list(cpu[step % len(cpu)]),
                     "sample_ids": [3 + step, step], "stage_times": stage_times})  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stages = [{"stage": 0, "component": "encoder", "layers": [0, 2], "pp_rank": 0, "encoder": encoder},
              {"stage": 1, "component": "llm", "layers": [0, 4], "pp_rank": 1, "recompute": "full"}]  # fmt: skip
    if encoder is None:
        del stages[0]["encoder"]
    (folder / "plan.json").write_text(json.dumps({"layout": {"stages": stages, "num_microbatches": 4}}))
    (folder / "config.json").write_text(json.dumps({"setup": "N-encoder planner (vision, audio), b_min 2"}))
    return folder


def test_a_run_folder_is_read_per_rank_and_stage(omni, tmp_path):
    run = write_run(tmp_path / "entrain", [500.0, 100.0, 120.0, 90.0], [5.0, 4.0, 3.0, 2.0])
    got = omni.measured(str(run))
    assert got["iter_ms"] == pytest.approx(100.0)  # the warm-up step dropped
    assert got["cpu_over_wall_per_rank"] == pytest.approx([0.9, 0.45, 0.3])  # medians of cpu / wall
    assert got["cpu_ms_per_rank"] == [90.0, 45.0, 30.0]
    assert got["busiest_cpu_over_wall"] == pytest.approx(0.9)
    # stage 0: fwd + bwd of both microbatches, median over the kept steps (27, 37, 47); stage 1: 7
    assert got["stage_ms"] == pytest.approx([37.0, 7.0])
    assert got["losses"] == [5.0, 4.0, 3.0, 2.0] and got["sample_ids"][1] == [1, 4]
    plan = omni.plan_summary(str(run))
    assert plan["stages"] == "vision[0,2)@0 llm[0,4)@1 full" and plan["num_microbatches"] == 4
    assert omni.plan_summary(str(write_run(tmp_path / "1f1b", [1.0], [1.0], encoder=None)))[
        "stages"
    ].startswith("encoder[0,2)@0")


def test_losses_are_equal_only_on_the_same_samples_within_the_tolerance(omni):
    ids = [[0, 1], [2, 3]]
    base = {"losses": [2.0, 1.5], "sample_ids": ids}
    close = {"losses": [2.0 * (1 + 5e-6), 1.5], "sample_ids": ids}
    got = omni.loss_check({"entrain": close, "1f1b": base})
    assert got["exact"] and got["max_rel_diff"] == pytest.approx(5e-6)
    far = {"losses": [2.0, 1.5 * (1 + 3e-5)], "sample_ids": ids}
    got = omni.loss_check({"entrain": far, "1f1b": base})
    assert not got["exact"] and got["max_rel_diff"] == pytest.approx(3e-5)
    other = {"losses": [2.0, 1.5], "sample_ids": [[0, 1], [2, 4]]}
    got = omni.loss_check({"entrain": other, "1f1b": base})
    assert not got["same_samples"] and not got["exact"]


def _round(e: float, b: float, cpu_e=(1.0, 2.0), cpu_b=(2.0, 2.0)) -> dict:
    return {
        "entrain": {"iter_ms": e, "cpu_ms_per_rank": list(cpu_e)},
        "1f1b": {"iter_ms": b, "cpu_ms_per_rank": list(cpu_b)},
    }


def test_the_real_ratio_is_the_median_of_the_paired_rounds(omni):
    # paired 1.5, 0.9, 0.95 -> median 0.95
    per_round = [_round(150.0, 100.0), _round(90.0, 100.0), _round(95.0, 100.0)]
    s = omni.summarize(per_round, {"entrain": 90.0, "1f1b": 100.0})
    assert s["ratios"] == pytest.approx([1.5, 0.9, 0.95]) and s["real_ratio"] == pytest.approx(0.95)
    assert s["spread"] == pytest.approx([0.9, 1.5]) and s["real_met"]
    assert s["sim_ratio"] == pytest.approx(0.9) and s["sim_rel_error"] == pytest.approx(0.9 / 0.95 - 1)
    assert not s["sim_met"]  # -5.3 %
    assert s["busiest_cpu_ratios"] == [1.0] * 3
    # the busiest rank's CPU ms per round: 3 / 4, 6 / 2, 1 / 4 -> median 0.75
    cpu = [_round(1, 1, (3, 1), (4, 4)), _round(1, 1, (1, 6), (2, 1)), _round(1, 1, (1, 1), (1, 4))]
    got = omni.summarize(cpu, {"entrain": 1.0, "1f1b": 1.0})
    assert got["busiest_cpu_ratios"] == [0.75, 3.0, 0.25] and got["busiest_cpu_ratio"] == 0.75
    # paired 0.5, 1.1, 2.73 -> median 1.1; the ratio of medians would be 110 / 110
    skew = [_round(100.0, 200.0), _round(110.0, 100.0), _round(300.0, 110.0)]
    assert omni.summarize(skew, {"entrain": 1.0, "1f1b": 1.0})["real_ratio"] == pytest.approx(1.1)


def _pass(omni, tmp_path, loss_rel: float) -> dict:
    per_round = []
    for i, ms in enumerate((95.0, 105.0)):
        runs = {}
        for system, t in (("entrain", ms), ("1f1b", 100.0)):
            scale = 1 + loss_rel if system == "entrain" and i == 1 else 1.0
            run = write_run(tmp_path / f"r{i}" / system, [300.0, t], [3.0, 2.0 * scale])
            runs[system] = omni.measured(str(run))
        per_round.append(runs)
    return {
        "config": {**omni.CONFIG, "nproc": 3, "cores": 2}, "load_before_round": [3.5, 1.25], "rounds": 2, "steps": 2, "orders": [["entrain", "1f1b"], ["1f1b", "entrain"]],
        "per_round": per_round, "loss_checks": [omni.loss_check(r) for r in per_round],
        "plans": {s: omni.plan_summary(str(tmp_path / "r0" / s)) for s in omni.SYSTEMS},
        "sim_busy_ms_per_rank": {"entrain": [20.0, 10.0, 50.0], "1f1b": [40.0, 20.0, 20.0]},
        "summary": omni.summarize(per_round, {"entrain": 95.0, "1f1b": 100.0}),
        "source": {"commit": "abc1234", "command": "python benchmarks/cpu_pipeline.py --omni"},
        "idle": {"passed": False, "idle_fraction": 0.4, "skipped": True}, "note": "loaded",
    }  # fmt: skip


def test_the_pass_is_a_section_of_the_paired_results_a_paired_pass_keeps(omni, tmp_path):
    cpu_paired = importlib.import_module("cpu_paired")
    out = tmp_path / "results"
    out.mkdir()
    (out / "cpu_pipeline_paired.json").write_text(
        json.dumps({"results": {}, "idle": {}, "sources": [{"commit": "def5678", "command": "paired"}]})
    )
    res = _pass(omni, tmp_path / "runs", 0.0)
    text = omni.record(out, res)
    assert text.startswith("# Real runs against the simulator") and "Source: commit def5678, `paired`" in text
    section = text[text.index("## Qwen2.5-Omni thinker") :]
    assert "Source: commit abc1234, `python benchmarks/cpu_pipeline.py --omni`" in section
    assert (
        "| 100 | 100 | 1.000 (0.950-1.050) | yes | 95 | 100 | 0.950 | -5.0% | 1.000 (1.000-1.000) | yes (0.0e+00, 1e-05) |"
        in section
    )
    assert "0.950 (entrain then 1f1b), 1.050 (1f1b then entrain)" in section
    assert "| entrain | vision[0,2)@0 llm[0,4)@1 full; K 4; N-encoder planner (vision, audio), b_min 2 | 0.90 / 0.45 / 0.30 | 90 / 45 / 30 | 20 / 10 / 50 | 27 / 7 |" in section  # fmt: skip
    assert (
        "Idle check skipped; the CPUs were 40% idle at the end of the pass; 1-minute load average before each round: 3.5, 1.2 (2 cores)."
        in section
    )
    assert "Note: loaded" in section
    recorded = json.loads((out / "cpu_pipeline_paired.json").read_text())
    assert recorded["omni"]["summary"]["real_ratio"] == pytest.approx(1.0)
    # a later --paired pass rewrites the report from the JSON: the section stays
    again = cpu_paired._save(str(out), recorded)
    assert again == text and (out / "cpu_pipeline_paired.md").read_text() == text
    off = omni.report(_pass(omni, tmp_path / "off", 1e-3))
    assert "| **no** (1.0e-03, 1e-05) |" in off


def test_a_round_is_one_launch_of_both_systems_on_three_processes(omni, monkeypatch):
    calls = []
    monkeypatch.setattr(omni.subprocess, "run", lambda cmd, **kw: calls.append((cmd, kw["env"])))
    omni._launch("CKPT", "OUT", ["1f1b", "entrain"], 4)
    ((cmd, env),) = calls
    flag = {
        name: cmd[cmd.index(name) + 1]
        for name in ("--model-path", "--system", "--nproc", "--dataset", "--steps")
    }
    assert flag == {"--model-path": "CKPT", "--system": "1f1b,entrain", "--nproc": "3", "--dataset": "omni",
                    "--steps": "4"}  # fmt: skip
    assert "--trace" in cmd and "--encoder-stages" not in cmd and env["ENTRAIN_PLAN_PREFETCH"] == "ahead"
