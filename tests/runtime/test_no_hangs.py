"""A peer that stalls or dies makes the surviving rank exit non-zero, naming the peer and the action,
within the ``--timeout-s`` (5 s here), not hang: forked ranks of ``entrain train``, no torchrun.

A stalled rank stays stalled until the survivor has exited (``_stall_until_rank0_exits``), not for
a fixed number of seconds that a loaded machine could outlast before the survivor's timeout fires."""

from __future__ import annotations

import os
import re
import time
import types
from pathlib import Path

import pytest

from .cli_ranks import run_ranks


def _stall_until_rank0_exits(folder: Path):
    """``run_ranks`` wrap: rank 0 leaves a marker when its CLI call returns; in the other ranks an
    injected ``stall`` lasts until that marker exists (at most 60 s)."""
    marker = folder / "rank0-exited"

    def wait(_seconds: float) -> None:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    def wrap(run):
        if os.environ["RANK"] == "0":
            try:
                return run()
            finally:
                marker.touch()
        from entrain.runtime import faults

        faults.time = types.SimpleNamespace(sleep=wait)  # only the fault's sleep waits for the marker
        return run()

    return wrap


ARGV = [
    "train",
    "--model",
    "tiny",
    "--dataset",
    "skewed",
    "--system",
    "1f1b",
    "--global-batch",
    "4",
    "--microbatch-size",
    "1",
    "--steps",
    "3",
    "--timeout-s",
    "5",
    "--no-progress",
]


@pytest.mark.parametrize("fault", ["stall:1:1:8", "kill:1:1"])
def test_a_stalled_or_dead_peer_fails_the_survivor_with_peer_and_action(tmp_path, fault):
    """Rank 1 (the LLM stage) stalls past the timeout or is SIGKILLed in step 1, after the step's
    first all-reduce: rank 0 (the encoder stage) waits for microbatch 0's gradient from it."""
    results = run_ranks(
        [*ARGV, "--out", str(tmp_path / "run")],
        2,
        tmp_path / "ranks",
        env={"ENTRAIN_FAULT": fault},
        timeout_s=100,
        wrap=_stall_until_rank0_exits(tmp_path),
    )
    survivor = results[0]
    assert survivor.exitcode is not None, "rank 0 hung"
    assert survivor.exitcode != 0
    message = next(line for line in survivor.stderr.splitlines() if line.startswith("entrain train: error:"))
    if fault.startswith("stall"):  # the first wait on rank 1: microbatch 0's gradient
        assert "rank 0: action 0RECV_B0 (stage 0, microbatch 0, sub 0) with rank 1 failed" in message, message
    else:  # a dead peer fails whichever transfer touches it first
        pattern = r"rank 0: action 0(SEND_F|RECV_B)(\d+) \(stage 0, microbatch \2, sub 0\) with rank 1 failed"
        assert re.search(pattern, message), message
    assert results[1].exitcode is not None and results[1].exitcode != 0  # killed, or failed after its stall


def test_a_peer_stalled_in_a_checkpoint_save_is_named_with_the_phase(tmp_path):
    """Rank 1 stalls past the timeout while the checkpoint of step 2 is saved (after every rank began
    the save): rank 0 fails in the collective tensor write, naming rank 1 and where it stopped."""
    argv = [*ARGV, "--checkpoint-every", "2", "--out", str(tmp_path / "run")]
    stall = _stall_until_rank0_exits(tmp_path)
    results = run_ranks(
        argv, 2, tmp_path / "ranks", env={"ENTRAIN_FAULT": "stall:1:2:8:save"}, timeout_s=100, wrap=stall
    )
    survivor = results[0]
    assert survivor.exitcode is not None and survivor.exitcode != 0, "rank 0 hung or succeeded"
    message = next(line for line in survivor.stderr.splitlines() if line.startswith("entrain train: error:"))
    assert (
        "rank 0: step 2: checkpoint save of step 2: model and optimizer state failed: rank 1 did not get"
        in message
    ), message
    assert "it last reached 'checkpoint save of step 2: start'" in message, message


def test_a_peer_stalled_in_a_checkpoint_load_is_named_with_the_phase(tmp_path):
    """A run saves the checkpoint of step 2; its resumed run has rank 1 stall past the timeout while
    that checkpoint is loaded: rank 0 fails in the collective tensor read, naming rank 1 and where it
    stopped."""
    out = str(tmp_path / "run")
    first = run_ranks([*ARGV, "--steps", "2", "--out", out], 2, tmp_path / "first", timeout_s=100)
    assert [r.exitcode for r in first] == [0, 0], [r.stderr[-500:] for r in first]
    argv = [*ARGV, "--resume", "--out", out]
    stall = _stall_until_rank0_exits(tmp_path)
    results = run_ranks(
        argv, 2, tmp_path / "ranks", env={"ENTRAIN_FAULT": "stall:1:2:8:load"}, timeout_s=100, wrap=stall
    )
    survivor = results[0]
    assert survivor.exitcode is not None and survivor.exitcode != 0, "rank 0 hung or succeeded"
    message = next(line for line in survivor.stderr.splitlines() if line.startswith("entrain train: error:"))
    assert "checkpoint load of step 2: model and optimizer state failed: rank 1 did not get" in message, (
        message
    )
    assert "it last reached 'checkpoint load of step 2: start'" in message, message
