"""The end of a training step (the loss and gradient-norm all-reduces, clipping, the optimizer step; the
real tiny CPU runs: 16-41 ms a step outside their traced actions) is priced once per iteration after
the DP gradient all-reduce (``HardwareSpec.step_end_ms`` plus ``step_end_ms_per_param_byte`` times the
heaviest pipeline rank's trainable parameter bytes), and ``entrain profile --from-trace`` fits both
terms from the runs' iteration times against their traced spans, without counting the all-reduce the
simulator prices on its own twice. Hand-made layouts at DP 2 (so there is an all-reduce to count),
traces written from the simulator's own spans on a "machine" with a known end of step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.presets import build_cost_model
from entrain.core.systems import generate_plan
from entrain.sim.executor import simulate_plan
from entrain.sim.step_end_fit import fit_step_end
from entrain.sim.trace_fit import TracedRun, refitted_model

from .fixtures import disjoint_layout, one_iteration, plain_assignment, raw_samples, toy_cost

PARAM_BYTES = 1000.0
"""Per layer (4 encoder and 4 LLM layers)."""
STEP_MS, PER_BYTE = 7.0, 0.002
CUTS = {(1, 1): 4 * PARAM_BYTES, (2, 2): 2 * PARAM_BYTES}
"""(encoder stages, LLM stages) -> the heaviest rank's parameter bytes."""


def _base() -> CostModel:
    """The toy cost model with a slow all-reduce (8 ms for a 4-layer rank at DP 2)."""
    cost = toy_cost(param_bytes=PARAM_BYTES)
    hw = replace(cost.hardware, allreduce_bandwidth_bytes_per_ms=500.0, allreduce_latency_ms=0.5)
    return replace(cost, hardware=hw)


def _with_end(cost: CostModel, ms: float, per_byte: float) -> CostModel:
    return replace(cost, hardware=replace(cost.hardware, step_end_ms=ms, step_end_ms_per_param_byte=per_byte))


def _plan(cost: CostModel, cut: tuple[int, int]):
    samples = raw_samples({"a": (2.0, 3.0), "b": (1.0, 4.0), "c": (3.0, 1.0), "d": (2.0, 2.0)})
    asg = one_iteration(plain_assignment([["a"], ["b"]]), plain_assignment([["c"], ["d"]]))
    return generate_plan("1f1b", disjoint_layout(*cut, dp=2, k=2), asg, samples, cost)


def _traced(plan, machine: CostModel, base: CostModel) -> TracedRun:
    """A traced run of ``plan`` on ``machine``: its simulated actions as trace events, its simulated
    iteration times in the metrics; planned with ``base``."""
    events, metrics = [], []
    for step, it in enumerate(simulate_plan(plan, machine, trace_iterations=len(plan.iterations))):
        t0_us = 1e7 * (step + 1)
        for rep in it.replicas:
            for s in rep.spans:
                a = s.action
                args = {"step": step, "kind": a.kind.value, "stage": a.stage, "mb": a.mb, "sub": a.sub_index}
                events.append({"ph": "X", "cat": "compute", "pid": s.rank, "ts": t0_us + s.start_ms * 1e3,
                               "dur": (s.end_ms - s.start_ms) * 1e3, "args": args})  # fmt: skip
        metrics.append({"step": step, "iteration_time_ms": it.iteration_time_ms})
    return TracedRun("run", plan, events, base, 1, metrics, {})


@pytest.mark.parametrize("cut", sorted(CUTS))
def test_the_end_of_step_is_priced_once_after_the_all_reduce(cut):
    base = _base()
    plan = _plan(base, cut)
    [plain] = simulate_plan(plan, base, trace_iterations=0)
    [ended] = simulate_plan(plan, _with_end(base, STEP_MS, PER_BYTE), trace_iterations=0)
    assert min(plain.allreduce_ms.values()) > 1.0  # DP 2: the gradient all-reduce is priced on its own
    assert ended.allreduce_ms == plain.allreduce_ms
    want = STEP_MS + PER_BYTE * CUTS[cut]
    assert ended.step_end_ms == pytest.approx(want)
    assert ended.iteration_time_ms - plain.iteration_time_ms == pytest.approx(want)
    assert plain.step_end_ms == 0.0


def test_the_presets_price_no_end_of_step():
    """Default 0: the A40 presets' simulated times do not move, and their JSON has no such key."""
    for hardware in ("a40-paper", "cpu-tiny"):
        hw = build_cost_model("tiny", hardware).to_json()["hardware"]
        assert "step_end_ms" not in hw and "step_end_ms_per_param_byte" not in hw


def test_the_fit_finds_both_terms_without_the_all_reduce():
    base = _base()
    machine = _with_end(base, STEP_MS, PER_BYTE)
    runs = [_traced(_plan(base, cut), machine, base) for cut in sorted(CUTS)]
    ms, per_byte, notes = fit_step_end(runs, base.hardware)
    assert (ms, per_byte) == (pytest.approx(STEP_MS), pytest.approx(PER_BYTE))
    assert notes["slope_fitted"] and len(notes["runs"]) == 2
    # one layout cannot tell the slope: the base's (0), the constant takes the run's whole end of step
    ms, per_byte, notes = fit_step_end(runs[:1], base.hardware)
    assert per_byte == 0.0 and not notes["slope_fitted"]
    assert ms == pytest.approx(STEP_MS + PER_BYTE * CUTS[(1, 1)])


def test_the_refitted_profile_prices_the_runs_as_they_ran(tmp_path):
    """The fitted terms reach the profile (hardware and notes, through its JSON) and its simulated
    iteration times are the machine's."""
    base = _base()
    machine = _with_end(base, STEP_MS, PER_BYTE)
    plans = {cut: _plan(base, cut) for cut in sorted(CUTS)}
    runs = [_traced(plan, machine, base) for plan in plans.values()]
    layers = {c: list(base.component(c).layers) for c in ("encoder", "llm")}
    refit = refitted_model(runs[0], layers, 0.0, {}, runs)
    path = tmp_path / "refit.json"
    refit.save(str(path))
    refit = CostModel.load(str(path))
    assert refit.notes["step_end"]["ms"] == pytest.approx(STEP_MS)
    for plan in plans.values():
        [got] = simulate_plan(plan, refit, trace_iterations=0)
        [want] = simulate_plan(plan, machine, trace_iterations=0)
        assert got.iteration_time_ms == pytest.approx(want.iteration_time_ms)
