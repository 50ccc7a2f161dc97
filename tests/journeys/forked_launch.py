"""``entrain train``'s own front process with its torchrun start replaced by forked gloo ranks.

``forked_workers(monkeypatch)`` swaps ``entrain.cli.launch._start_workers`` (which receives the
worker argv and the process count) for ``start_forked``: the same ``entrain train ARGV`` on
``tests/runtime/cli_ranks.py``'s ``run_ranks`` (forks of the test process with torchrun's
environment variables), each worker's Entrain error written where the parent reads it. Everything
before and after the launch (flag checks, planning, the run folder, the exit status) is the real
code path; no torchrun is started."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from entrain.runtime.launcher import ERROR_DIR_ENV, worker_errors
from tests.runtime.cli_ranks import run_ranks

RANK_TIMEOUT_S = 180.0
"""Per launch; the ranks' own ``--timeout-s`` ends a hung collective well before."""


def start_forked(argv: list[str], nproc: int) -> tuple[int, list[str]]:
    """What ``_start_workers`` returns: the first failed rank's exit status (1 for a rank killed at
    ``RANK_TIMEOUT_S``) and the Entrain errors the workers wrote. A rank that failed without one
    has its stderr copied to this process's stderr."""
    with tempfile.TemporaryDirectory(prefix="entrain-forked-") as folder:
        errors = Path(folder) / "errors"
        errors.mkdir()
        ranks = run_ranks(
            ["train", *argv],
            nproc,
            Path(folder) / "ranks",
            env={ERROR_DIR_ENV: str(errors)},
            timeout_s=RANK_TIMEOUT_S,
        )
        messages = worker_errors(str(errors))
    failed = [r for r in ranks if r.exitcode != 0]
    if failed and not messages:
        for r in failed:
            print(r.stderr[-4000:], file=sys.stderr)
    status = (failed[0].exitcode or 1) if failed else 0
    return status, messages


def forked_workers(monkeypatch) -> None:
    from entrain.cli import launch

    monkeypatch.setattr(launch, "_start_workers", start_forked)
