"""What a step reports on one GPU: the forward / backward times of its
compute actions come from CUDA events (one ``elapsed_time`` read per record, every one positive, all
of them together within the step's time), and the peak device memory is measured per step (a small
step after a big one reports a smaller peak). One spawned worker runs both scenarios."""

from __future__ import annotations

import pytest
import torch

from entrain.core.workload.samples import SampleMeta
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm
from entrain.runtime.data import SampleRenderer
from entrain.runtime.trainer import OptimConfig, PipelineTrainer

from .cases import SEED, batch_metas, plan_for, works
from .gpu_harness import each_scenario, run_spawned, scenario

pytestmark = pytest.mark.gpu

K = 4


def big_metas() -> list[SampleMeta]:
    """8 samples of two 448 x 448 images (1,024 patches each) and 600 text tokens: many times the
    activations of ``batch_metas`` (16-144 patches per image)."""
    return [SampleMeta(f"big{i}", ((448, 448), (448, 448)), 600) for i in range(8)]


def _trainer(env, plan, metas: list[SampleMeta]) -> PipelineTrainer:
    cfg = get_model_config("tiny")
    renderer = SampleRenderer(cfg, {m.id: m for m in metas}, seed=SEED, device=env.device)
    return PipelineTrainer(
        layout=plan.layout, model=build_vlm(cfg, seed=SEED), env=env, renderer=renderer, optim=OptimConfig()
    )


READS = {"elapsed_time": 0}
"""Times read from events while ``_counting_events`` is active."""


def _counting(base: type) -> type:
    """``base`` (an event class) whose ``elapsed_time`` reads are counted in ``READS``."""

    class Counting(base):
        def elapsed_time(self, end_event) -> float:
            READS["elapsed_time"] += 1
            return super().elapsed_time(end_event)

    return Counting


def _event_times(env) -> list[dict]:
    """Two steps of one Plan with ``torch.cuda.Event`` and ``torch.Event`` counting their reads:
    per step the records, the rank's compute records, the event reads and the step's time."""
    plan = plan_for("dip", 1, 1, 1, K, works(batch_metas()))
    trainer = _trainer(env, plan, batch_metas())
    originals = (torch.cuda.Event, torch.Event)
    torch.cuda.Event, torch.Event = (_counting(c) for c in originals)
    steps = []
    try:
        for _ in range(2):
            READS["elapsed_time"] = 0
            result = trainer.train_step(plan.iterations[0])
            steps.append(
                {
                    "records": result.records,
                    "num_compute_records": len(trainer._last_records),
                    "event_reads": READS["elapsed_time"],
                    "iteration_time_ms": result.iteration_time_ms,
                }
            )
    finally:
        torch.cuda.Event, torch.Event = originals
    return steps


def _peaks(env) -> list[dict]:
    """Steps small, big, small on one trainer: each step's ``StepResult.memory`` of rank 0."""
    small, big = batch_metas(), big_metas()
    plans = {name: plan_for("dip", 1, 1, 1, K, works(m)) for name, m in (("small", small), ("big", big))}
    assert plans["small"].layout == plans["big"].layout
    trainer = _trainer(env, plans["small"], small + big)
    return [trainer.train_step(plans[name].iterations[0]).memory[0] for name in ("small", "big", "small")]


def _measurements(env) -> dict:
    return {
        "device": str(env.device),
        **each_scenario({"events": lambda: _event_times(env), "peaks": lambda: _peaks(env)}),
    }


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    [result] = run_spawned(_measurements, 1, tmp_path_factory.mktemp("gpu-measurements"))
    assert result["device"].startswith("cuda"), result["device"]
    return result


def test_stage_times_come_from_cuda_events(measured):
    steps = scenario(measured, "events")
    for i, step in enumerate(steps):
        assert step["num_compute_records"] > 0
        # every record read from a pair of events (other code may read events too)
        assert step["event_reads"] >= step["num_compute_records"], f"step {i}: {step}"
        rows = step["records"]
        assert rows and all(r["fwd_ms"] > 0 and r["bwd_ms"] > 0 for r in rows), rows
        # one stream, actions in sequence: their GPU intervals are disjoint and inside the step
        total_ms = sum(r["fwd_ms"] + r["bwd_ms"] for r in rows)
        assert total_ms <= step["iteration_time_ms"] + 0.01, (total_ms, step["iteration_time_ms"])
    assert [(r["stage"], r["mb"], r["sub"]) for r in steps[0]["records"]] == [
        (r["stage"], r["mb"], r["sub"]) for r in steps[1]["records"]
    ]


def test_peak_device_memory_is_reported_and_reset_per_step(measured):
    small, big, small_again = scenario(measured, "peaks")
    for mem in (small, big, small_again):
        state = mem["params_bytes"] + mem["grads_bytes"]
        assert mem["peak_device_bytes"] >= state, mem
    assert big["peak_device_bytes"] > small["peak_device_bytes"], (small, big)
    # without a reset at the start of a step the third step would report the big step's peak
    assert small_again["peak_device_bytes"] < big["peak_device_bytes"], (big, small_again)
