"""The memory check's last start for Entrain (``memory_fit.TWO_RESOURCE``): where no start of the paper's
assignment fits, the two-resource assignment at the requested microbatch count is simulated too and taken
where it fits (Algorithm 3 sends every sample without encoder work to one bin: mixture / Qwen3VL-30B-A3B);
where a start fits, or for a baseline, nothing more is simulated, so fitting plans are unchanged."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import entrain.sim.memory_fit as mf
from entrain.core.ir.plan import ComponentLayout, Layout, StageSpec
from entrain.core.planning.system_setup import SystemSetup

LAYOUT = Layout(
    dp=1, microbatch_size=1, num_microbatches=2,
    components={"encoder": ComponentLayout(), "llm": ComponentLayout()},
    stages=(StageSpec(0, "encoder", 0, 1, 0), StageSpec(1, "llm", 0, 1, 1)),
)  # fmt: skip


def _fake(fits_paper: bool, calls: list):
    def run_system(system, layout, batches, cost, options, **_):
        calls.append(dict(options))
        fits = fits_paper or options.get("assignment") == "two-resource"
        metrics = SimpleNamespace(
            fits_memory=fits, iteration_time_ms=100.0, peak_memory_bytes_per_rank=[],
            model_state_bytes_per_rank=[],
        )  # fmt: skip
        return SimpleNamespace(metrics=metrics, plan=SimpleNamespace(iterations=[]), layout=layout)

    return run_system


@pytest.mark.parametrize("system", ["entrain", "1f1b"])
def test_two_resource_start_only_where_nothing_fits(monkeypatch, system):
    cost = SimpleNamespace(hardware=SimpleNamespace(device_memory_bytes=1.0))
    setup = SystemSetup(LAYOUT, {}, "hand")
    calls: list = []
    monkeypatch.setattr(mf, "run_system", _fake(False, calls))
    got, run = mf.fit_memory_best(system, setup, [], cost, margin=0.0033)
    (d,) = got.decisions
    if system == "entrain":
        assert d.chosen == mf.TWO_RESOURCE and run.metrics.fits_memory is True
        assert got.options == {"assignment": "two-resource", "microbatch_count": "requested"}
        assert sum(c.get("assignment") == "two-resource" for c in calls) == 1  # tried once
    else:  # a baseline keeps its own assignment
        assert mf.TWO_RESOURCE not in d.candidates and run.metrics.fits_memory is False
    calls.clear()
    monkeypatch.setattr(mf, "run_system", _fake(True, calls))
    got, _ = mf.fit_memory_best(system, setup, [], cost, margin=0.0033)
    assert mf.TWO_RESOURCE not in got.decisions[0].candidates and got.options == {}
    assert not any(c.get("assignment") == "two-resource" for c in calls)
