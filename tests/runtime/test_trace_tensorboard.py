"""``entrain train --trace --tensorboard --precision bf16`` on 1 encoder + 1 LLM stage (two forked gloo
workers, no torchrun): trace.json holds every action of every rank with start and duration and
each rank's end of step after them, TensorBoard gets the step scalars, bf16 runs on the CPU with fp32
master weights, and ``entrain plot-trace`` draws the real Gantt beside the simulated one."""

from __future__ import annotations

import json
from collections import Counter
from importlib import resources

import jsonschema
import pytest
import torch

from entrain.cli.main import build_parser, main
from entrain.cli.train import _spec
from entrain.core.ir.plan import Plan
from entrain.runtime.session import run_systems

from .harness import run_workers

STEPS = 2


def _train(env, spec):
    summaries = run_systems(spec, env)
    return [s.last_loss for s in summaries]


def test_trace_tensorboard_bf16_and_plot(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--model", "tiny", "--dataset", "skewed", "--system", "entrain", "--global-batch", "4",
            "--microbatch-size", "1", "--steps", str(STEPS), "--out", str(run), "--no-progress",
            "--trace", "--tensorboard", "--precision", "bf16"]  # fmt: skip
    spec = _spec(build_parser().parse_args(argv))
    losses = run_workers(_train, 2, tmp_path / "workers", spec, timeout_s=120)
    assert losses[0] == losses[1]

    config = json.loads((run / "config.json").read_text())
    assert config["precision"] == "bf16"
    plan = Plan.from_json(json.loads((run / "plan.json").read_text()))
    trace = json.loads((run / "trace.json").read_text())["traceEvents"]
    actions = [e for e in trace if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] > 0 for e in actions)
    for step in range(STEPS):  # exactly the plan's actions, per rank and kind
        for rank, todo in plan.iterations[step].actions.items():
            ran = Counter(
                e["args"]["kind"] for e in actions if e["pid"] == rank and e["args"]["step"] == step
            )
            assert ran == Counter(a.kind.value for a in todo), (step, rank)
    assert {e["cat"] for e in actions} == {"compute", "comm"}
    # each rank's end of step, after its last action (the all-reduces, clipping, the optimizer step)
    ends = json.loads((run / "trace.json").read_text())["stepEnds"]
    assert sorted((e["pid"], e["args"]["step"]) for e in ends) == [
        (r, s) for r in (0, 1) for s in range(STEPS)
    ]
    for e in ends:
        mine = [a for a in actions if a["pid"] == e["pid"] and a["args"]["step"] == e["args"]["step"]]
        assert e["cat"] == "step_end" and e["dur"] > 0
        assert e["ts"] >= max(a["ts"] + a["dur"] for a in mine) - 0.2  # rounded to 0.1 us
    assert {e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "process_name"} == {
        "rank 0",
        "rank 1",
    }

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/iteration_ms", "train/tokens_per_s",
            "train/stage_std_ms", "data/skipped_samples"} <= tags  # fmt: skip
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(STEPS))
    assert abs(acc.Scalars("train/loss")[-1].value - losses[0][0]) < 1e-5

    png = tmp_path / "gantt.png"
    assert main(["plot-trace", str(run), "--out", str(png), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    schema = json.loads(resources.files("entrain").joinpath("schemas/plot_trace.json").read_text())
    jsonschema.validate(out, schema)
    assert png.stat().st_size > 10_000 and out["step"] == STEPS - 1
    assert out["real_ms"] > 0 and out["simulated_ms"] > 0


class _FakeEvent:
    """A CUDA event on a fake device clock that advances 2 ms per recorded event."""

    now_ms = 0.0

    def __init__(self, enable_timing: bool = False):
        self.at_ms = None

    def record(self):
        _FakeEvent.now_ms += 2.0
        self.at_ms = _FakeEvent.now_ms

    def synchronize(self):
        pass

    def elapsed_time(self, other) -> float:
        return other.at_ms - self.at_ms


def test_on_cuda_the_trace_takes_action_times_from_cuda_events(monkeypatch):
    """The device's times, not the host's: with a fake event clock the recorded durations are the
    events' (2 ms per event), whatever the host clock did."""
    from entrain.core.ir.plan import Action
    from entrain.runtime.trace import ActionTracer

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    tracer = ActionTracer(0)
    tracer.start_step(torch.device("cuda", 0))
    for text in ("0F0", "0SEND_F0"):
        token = tracer.begin()
        tracer.end(Action.parse(text), token, None)
    assert tracer.events == []  # read once, at the step's end
    tracer.finish_step()
    durations = [e["dur"] for e in tracer.events]
    assert durations == [2000.0, 2000.0]
    starts = [e["ts"] for e in tracer.events]
    assert starts[1] - starts[0] == pytest.approx(4000.0)
