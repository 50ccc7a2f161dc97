"""benchmarks/step_end_offline.py: "before" is the same profile with no end of step at all (both the
constant and the per-byte part), and a run's time outside its traced actions is its iteration ms less
its traced span, per kept step."""

from __future__ import annotations

import importlib
import json
import statistics
from dataclasses import replace

import pytest

from entrain.core.costs.presets import build_cost_model


@pytest.fixture(scope="module")
def offline(benchmarks_on_path):
    return importlib.import_module("step_end_offline")


def test_before_has_no_end_of_step(offline):
    cost = build_cost_model("tiny", "cpu-tiny")
    ended = replace(cost, hardware=replace(cost.hardware, step_end_ms=20.0, step_end_ms_per_param_byte=1e-6))
    before = offline.without_end(ended)
    assert (before.hardware.step_end_ms, before.hardware.step_end_ms_per_param_byte) == (0.0, 0.0)
    assert before.to_json() == cost.to_json()


def _event(step: int, ts_ms: float, dur_ms: float, pid: int = 0) -> dict:
    return {"ph": "X", "pid": pid, "ts": ts_ms * 1e3, "dur": dur_ms * 1e3, "args": {"step": step}}


def test_outside_is_the_iteration_less_the_traced_span(offline, tmp_path):
    """Step 0 is the warm-up (dropped); the span runs from the first action's start on any rank to the
    last one's end on any rank."""
    events = [_event(0, 0, 50), _event(1, 100, 10), _event(1, 105, 20, pid=1), _event(2, 200, 30)]
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": events}))
    rows = [{"step": 0, "iteration_time_ms": 90.0}, {"step": 1, "iteration_time_ms": 45.0},
            {"step": 2, "iteration_time_ms": 60.0}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert offline.outside_ms(str(tmp_path)) == pytest.approx(statistics.median([45.0 - 25.0, 60.0 - 30.0]))
