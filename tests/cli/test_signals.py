"""Journey: ``kill -TERM`` or Ctrl-C (SIGINT) sent to the ``entrain train --nproc 2`` front process alone
stops the whole run: the signal reaches torchrun and its workers (which torch starts in sessions of
their own), every process has ended when the front process exits, with 143 / 130 and one line on
stderr; a process that ignores the signal is killed after the launcher's wait.

The front process is real (``entrain.cli.main.main`` in a subprocess); torchrun is replaced by a fake
that starts a worker in its own session, and both write a heartbeat file (no torchrun launch)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrain.runtime.launcher import descendants

FAKE_TORCHRUN = """
import os, signal, subprocess, sys, time
folder, stubborn, role = sys.argv[1], sys.argv[2] == "stubborn", sys.argv[3]
for signum in (signal.SIGTERM, signal.SIGINT):  # ignored, or the default action: end at once, quietly
    signal.signal(signum, signal.SIG_IGN if stubborn else signal.SIG_DFL)
if role == "torchrun":  # the worker in a session of its own, as torch's elastic agent starts it
    subprocess.Popen([sys.executable, __file__, folder, sys.argv[2], "worker"], start_new_session=True)
with open(os.path.join(folder, role + ".pid"), "w") as f:
    f.write(str(os.getpid()))
while True:
    with open(os.path.join(folder, role + ".beat"), "a") as f:
        f.write(".")
    time.sleep(0.02)
"""

FRONT = """
import sys
from entrain.cli import launch
from entrain.runtime import launcher
from entrain.cli.main import main
fake, folder, mode, out = sys.argv[1:5]
launcher.STOP_WAIT_S = 2.0
launch._torchrun_command = lambda argv, nproc: [sys.executable, fake, folder, mode, "torchrun"]
sys.exit(main(["train", "--nproc", "2", "--model", "tiny", "--system", "1f1b", "--encoder-stages", "1",
               "--llm-stages", "1", "--global-batch", "4", "--microbatch-size", "1", "--steps", "1",
               "--device", "cpu", "--no-progress", "--out", out]))
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


def _wait_for(paths: list[Path], front: subprocess.Popen, err_path: Path) -> None:
    deadline = time.monotonic() + 120
    while not all(p.exists() and p.stat().st_size > 0 for p in paths):
        assert front.poll() is None, err_path.read_text()
        assert time.monotonic() < deadline, "the fake torchrun tree never started"
        time.sleep(0.05)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc")
@pytest.mark.parametrize(
    "signum, mode, status, line",
    [
        (signal.SIGTERM, "plain", 143, "terminated at step 0; continue with --resume"),
        (signal.SIGINT, "plain", 130, "interrupted at step 0; continue with --resume"),
        (signal.SIGTERM, "stubborn", 143, "terminated at step 0; continue with --resume"),
    ],
)
def test_a_signal_to_the_front_process_stops_every_process_of_the_run(tmp_path, signum, mode, status, line):
    fake = tmp_path / "fake_torchrun.py"
    fake.write_text(FAKE_TORCHRUN)
    folder = tmp_path / "tree"
    folder.mkdir()
    argv = [sys.executable, "-c", FRONT, str(fake), str(folder), mode, str(tmp_path / "run")]
    err_path = tmp_path / "front.err"  # a file, not a pipe: a surviving process would hold a pipe open
    with open(err_path, "w") as err_file:
        front = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err_file)
    roles = ("torchrun", "worker")
    pids: list[int] = []
    try:
        _wait_for(
            [folder / f"{r}.beat" for r in roles] + [folder / f"{r}.pid" for r in roles], front, err_path
        )
        pids = [int((folder / f"{r}.pid").read_text()) for r in roles]
        assert set(pids) <= {pid for pid, _ in descendants(front.pid)}
        front.send_signal(signum)  # the front process alone, as `kill -TERM PID` does
        assert front.wait(timeout=60) == status, err_path.read_text()
        assert [pid for pid in pids if _running(pid)] == []
        beats = [(folder / f"{r}.beat").read_text() for r in roles]
        time.sleep(0.3)
        assert [(folder / f"{r}.beat").read_text() for r in roles] == beats  # no heartbeat any more
        assert err_path.read_text() == line + "\n"
    finally:  # nothing outlives a failed test
        for pid in [front.pid, *pids]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def test_sigterm_stops_a_single_process_run_as_ctrl_c_does(tmp_path):
    """A run the front process trains itself (one process): SIGTERM closes its records, names the step
    to resume from in one line and exits 143; the background planner it started ends with it."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "entrain", "train", "--model", "tiny", "--system", "dip", "--global-batch", "2",
            "--microbatch-size", "1", "--steps", "1000", "--no-progress", "--out", str(out)]  # fmt: skip
    err_path = tmp_path / "front.err"
    with open(err_path, "w") as err_file:
        front = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err_file)
    below: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 1):
            assert front.poll() is None and time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.05)
        below = [pid for pid, _ in descendants(front.pid)]
        front.send_signal(signal.SIGTERM)
        assert front.wait(timeout=60) == 143, err_path.read_text()
        steps = (out / "metrics.jsonl").read_text().count("\n")
        assert err_path.read_text().splitlines()[-1] == f"terminated at step {steps}; continue with --resume"
        deadline = time.monotonic() + 30  # the planner process notices its parent is gone
        while [pid for pid in below if _running(pid)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in below if _running(pid)] == []
    finally:
        for pid in [front.pid, *below]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
