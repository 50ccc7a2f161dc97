"""torchrun as ``entrain train --nproc N`` starts it: ``python -m entrain.cli.launch TORCHRUN-ARGS``;
``launch`` starts it, restarts the group after a re-plan and turns how it ended into the exit status.

The same launcher as ``python -m torch.distributed.run`` (``torch.distributed.run.run``), made quiet
for a user: torch's elastic agent logs nothing below CRITICAL and a failed worker is no
``ChildFailedError`` traceback, only an exit status, the first failed worker's (``ERROR_EXIT`` = 2
for an Entrain error, ``INTERRUPTED_EXIT`` = 130 for Ctrl-C). The workers write their error
messages to files in ``$ENTRAIN_ERROR_DIR`` (``entrain.runtime.launcher``), which the parent prints once.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile

from entrain.runtime.launcher import (
    ERROR_DIR_ENV,
    ERROR_EXIT,
    INTERRUPTED_EXIT,
    STOPPED_EXITS,
    stop_on_signals,
    worker_errors,
)

__all__ = ["ERROR_EXIT", "INTERRUPTED_EXIT", "launch", "main"]


def launch(args: argparse.Namespace, spec, nproc: int) -> int:
    """Run ``entrain train`` on ``nproc`` torchrun workers with the resolved flags, again on the new plan
    after a re-plan; the exit status: 0, ``ERROR_EXIT`` after a worker's Entrain error (printed once),
    ``128 + N`` after signal N (130 Ctrl-C, 143 SIGTERM, 129 hang-up: the signal is forwarded to every
    process of the run, each has ended, one line says where to resume), else the failed worker's."""
    from entrain.cli.train_args import child_argv, relaunch_args
    from entrain.runtime.replan import REPLAN_EXIT

    while True:
        rc, messages = _start_workers(child_argv(args), nproc)
        if rc != REPLAN_EXIT or messages:
            return _exit_status(rc, messages, spec)
        args = relaunch_args(args, spec)  # a re-plan checkpointed: the group again, on the new layout


def _torchrun_command(argv: list[str], nproc: int) -> list[str]:
    cmd = [sys.executable, "-m", "entrain.cli.launch", "--standalone", f"--nproc-per-node={nproc}"]
    return [*cmd, "-m", "entrain", "train", *argv]


def _start_workers(argv: list[str], nproc: int) -> tuple[int, list[str]]:
    """torchrun's exit status (``128 + N`` after signal N stopped the run: ``stop_on_signals``) and the
    Entrain errors its workers wrote."""
    errors = tempfile.mkdtemp(prefix="entrain-errors-")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    # a fresh rendezvous store per restart round: the shared agent store keeps the previous round's
    # gloo addresses, which a restarted group then tries to connect to
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    env[ERROR_DIR_ENV] = errors
    try:
        # its own session: a terminal's Ctrl-C reaches this process only, which stops the whole tree once
        cmd = _torchrun_command(argv, nproc)
        rc = stop_on_signals(lambda: subprocess.Popen(cmd, env=env, start_new_session=True))
        return rc, worker_errors(errors)
    finally:
        shutil.rmtree(errors, ignore_errors=True)


def _exit_status(rc: int, messages: list[str], spec) -> int:
    from entrain.runtime.run_folder import interrupted_line

    if rc == 0:
        return 0
    if rc in STOPPED_EXITS:  # Ctrl-C, SIGTERM or a hang-up: every process of the run has ended
        print(interrupted_line(spec, STOPPED_EXITS[rc]), file=sys.stderr, flush=True)
        return rc
    for message in messages:
        print(f"entrain train: error: {message}", file=sys.stderr, flush=True)
    if not messages:
        print(
            f"entrain train: error: a training process failed with exit status {rc} (its output is above)",
            file=sys.stderr,
            flush=True,
        )
    return ERROR_EXIT if messages else rc


def main(argv: list[str]) -> int:
    previous = os.environ.get("LOGLEVEL")
    os.environ["LOGLEVEL"] = "CRITICAL"  # read when torch's elastic loggers are created (at import)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    if previous is None:  # the workers inherit the environment: leave theirs as it was
        del os.environ["LOGLEVEL"]
    else:
        os.environ["LOGLEVEL"] = previous
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    logging.getLogger("torch.distributed").setLevel(logging.CRITICAL)
    try:
        run(parse_args(argv))
    except ChildFailedError as e:
        _, failure = e.get_first_failure()
        return failure.exitcode if failure.exitcode > 0 else 1
    except (SignalException, KeyboardInterrupt):
        return INTERRUPTED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
