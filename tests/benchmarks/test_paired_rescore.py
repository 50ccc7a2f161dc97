"""benchmarks/cpu_paired_rescore.py: the replay prices every compute action at its traced duration (so
what is left against the real step is the simulator's execution model), and the real ratio's spread is
the bootstrap interval of its median over rounds."""

from __future__ import annotations

import importlib
import json

import pytest

from entrain.core.costs.presets import build_cost_model
from entrain.core.planning.setups import ConfigRequest, system_setups
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.systems import plan_system
from entrain.core.workload.samples import VisionTokenConfig
from entrain.data.sampling import dataset_sampler
from entrain.sim.choose import candidate_judge, planner_draws
from entrain.sim.executor import run_iteration

MAX_PIXELS = 224 * 224
SLOWER = 1.5
"""The synthetic trace's actions last this times the preset's price."""


@pytest.fixture(scope="module")
def rescore(benchmarks_on_path):
    return importlib.import_module("cpu_paired_rescore")


class Scaled(PlanCosts):
    def compute_ms(self, stage, kind, ids):
        return SLOWER * super().compute_ms(stage, kind, ids)


def _plan(dataset: str):
    req = ConfigRequest(dataset, "tiny", gpus=2, dp=None, tp=1, global_batch=8, microbatch_size=2)
    cost = build_cost_model("tiny", "cpu-tiny")
    sampler = dataset_sampler(dataset, req.seed, vision=VisionTokenConfig(max_pixels=MAX_PIXELS))
    setup = system_setups(["1f1b"], req, cost, sampler, candidate_judge(sampler, cost, req))["1f1b"]
    return plan_system("1f1b", setup.layout, planner_draws(sampler, cost, req), cost, setup.options), cost


def _write_run(folder, plan, cost, slower: float = SLOWER) -> None:
    """A traced run folder of ``plan``: each rank's compute actions back to back (no gaps, no transfers
    traced), each lasting ``slower`` x its price; iteration time = the step's span + 20 ms."""
    costs, events, iters = PlanCosts(plan.layout, cost, plan.samples), [], []
    for step, it in enumerate(plan.iterations):
        end = 0.0
        for rank, actions in it.actions.items():
            ts = 0.0
            for a in (a for a in actions if a.kind.is_compute):
                mb = it.microbatches[0][a.mb]
                subs = mb.encoder_subs if plan.layout.stages[a.stage].component == "encoder" else mb.llm_subs
                dur = slower * costs.compute_ms(a.stage, a.kind, tuple(subs[a.sub_index]))
                args = {"step": step, "kind": a.kind.value, "stage": a.stage, "mb": a.mb, "sub": a.sub_index}
                events.append(
                    {"cat": "compute", "ph": "X", "ts": ts * 1e3, "dur": dur * 1e3, "pid": rank, "args": args}
                )
                ts += dur
            end = max(end, ts)
        iters.append({"step": step, "iteration_time_ms": end + 20.0})
    (folder / "plan.json").write_text(json.dumps(plan.to_json()))
    (folder / "trace.json").write_text(json.dumps({"traceEvents": events}))
    spec = {"model": "tiny", "max_pixels": MAX_PIXELS, "tp": 1}
    (folder / "config.json").write_text(json.dumps({"spec": spec, "device": "cpu", "precision": "fp32"}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in iters))


def test_the_replay_prices_each_action_at_its_traced_duration(rescore, tmp_path):
    plan, cost = _plan("chartqa")
    _write_run(tmp_path, plan, cost)
    rows = rescore.replay(str(tmp_path))  # the measured overhead: none (back to back, no transfers)
    assert len(rows) == len(plan.iterations) - rescore.WARMUP
    for step, row in enumerate(rows, start=rescore.WARMUP):
        it = plan.iterations[step]
        want = run_iteration(plan.layout, it, Scaled(plan.layout, cost, plan.samples)).iteration_time_ms
        assert row["replay_ms"] == pytest.approx(want, rel=1e-9)
        assert row["iteration_ms"] - row["span_ms"] == pytest.approx(20.0)
    given = rescore.replay(str(tmp_path), overhead_ms=1.0)
    assert all(g["replay_ms"] > r["replay_ms"] for g, r in zip(given, rows))


def test_the_spread_is_the_bootstrap_interval_of_the_median(rescore):
    # one loaded round of seven: the median's interval stays at the others; a mean's would not
    lo, hi = rescore.median_interval([0.90, 0.91, 0.92, 0.90, 0.91, 0.92, 1.60])
    assert 0.90 <= lo <= hi <= 0.92
    assert rescore.median_interval([0.9] * 5) == (0.9, 0.9)
    assert rescore.median_interval([0.8, 0.9, 1.0], seed=3) == rescore.median_interval(
        [0.8, 0.9, 1.0], seed=3
    )


def test_the_planned_refit_fits_round_0_of_the_source_pass_only(rescore, tmp_path):
    """``--planned``: the profile the pass planned with is round 0's 1F1B and Entrain traces of the
    source pass fitted jointly (``cpu_paired.joint_fit``); a later round of that pass, traced 2x slower,
    does not enter it: the round-0 Plans simulate about ``SLOWER`` x their preset time under it."""
    plan, cost = _plan("chartqa")
    for i, slower in enumerate((SLOWER, 2 * SLOWER)):
        for system in rescore.PASS_SYSTEMS:
            folder = tmp_path / "source" / f"round{i}" / system
            folder.mkdir(parents=True)
            _write_run(folder, plan, cost, slower)
    first = tmp_path / "source" / "round0"
    out = tmp_path / "planned.json"
    got = rescore.planned_refit(str(tmp_path / "source"), str(first), str(out), "test")
    preset = rescore.simulated_ms(str(first / "1f1b"), cost)
    assert set(got) == set(rescore.PASS_SYSTEMS)
    assert got["1f1b"] / preset == pytest.approx(SLOWER, rel=0.1), got["1f1b"] / preset
    notes = json.loads(out.read_text())["notes"]
    assert notes["from_trace"] == ["round 0 of test, 1f1b", "round 0 of test, entrain"]
    with pytest.raises(SystemExit):
        rescore.main(["--key", "k", "--rounds", str(tmp_path), "--planned"])
