"""``entrain train``'s front process stopped at its launch, and the setups its workers plan: what tests of
``train``'s planning compare against ``entrain plan`` without starting a rank."""

from __future__ import annotations


def train_spec(monkeypatch, argv: list[str]):
    """The run spec ``entrain train ARGV`` hands its launch (``cli.train._launch``, stubbed: no process
    starts); the front process's checks, planning inputs and run folder are the real code path."""
    from entrain.cli import train as train_cli
    from entrain.cli.main import main

    seen = {}
    monkeypatch.setattr(train_cli, "_launch", lambda args, spec, nproc: seen.update(spec=spec) or 0)
    assert main(["train", *argv]) == 0
    return seen["spec"]


def worker_callables() -> tuple:
    """The planner callables ``train``'s worker hands ``run_systems`` (``cli.train_worker.main``), in
    ``runtime.planning.run_setups``' order: memory check, judge factory, the N-encoder profile, its memory
    fit, the ``encoder towers`` decision."""
    from entrain.cli import train_worker as worker

    return (
        worker._memory_check,
        worker._judge_factory,
        worker._encoders_profile,
        worker._encoders_fit,
        worker._encoders_towers,
    )


def worker_setups(spec, cost, batches, gpus: int) -> dict:
    """Each system's setup as ``train``'s workers plan it on ``gpus`` (``run_setups`` with
    ``worker_callables``)."""
    from entrain.runtime.planning import run_setups

    return run_setups(spec, cost, batches, gpus, *worker_callables())
