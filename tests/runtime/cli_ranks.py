"""Run ``entrain train`` as forked ranks (torchrun's environment variables, no torchrun launch).

Each rank is a fork of the test process (torch already imported) that calls
``entrain.cli.main.main`` with ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` / ``MASTER_PORT`` set,
exactly as under torchrun, and leaves with its exit code; stdout and stderr go to files.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def cli_argv(command: str, flags: dict) -> list[str]:
    """``[command, --flag, value, ...]``: ``{"global_batch": 8, "no_progress": True}`` ->
    ``--global-batch 8 --no-progress``."""
    argv = [command]
    for name, value in flags.items():
        argv.append("--" + name.replace("_", "-"))
        if value is not True:
            argv.append(str(value))
    return argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    argv: list[str], rank: int, world: int, port: int, folder: str, env: dict, wrap: Callable | None
) -> None:
    out = open(os.path.join(folder, f"rank{rank}.out"), "w")  # noqa: SIM115 - process exits below
    err = open(os.path.join(folder, f"rank{rank}.err"), "w")  # noqa: SIM115
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.stdout, sys.stderr = out, err
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    import torch

    torch.set_num_threads(1)
    from entrain.cli.main import main

    try:
        rc = wrap(lambda: main(argv)) if wrap is not None else main(argv)
    except BaseException as e:  # noqa: BLE001 - reported through the exit code and stderr
        import traceback

        traceback.print_exc()
        rc = 3 if not isinstance(e, SystemExit) else (e.code or 0)
    out.flush()
    err.flush()
    os._exit(rc)


@dataclass
class RankResult:
    exitcode: int | None
    stdout: str
    stderr: str


def run_ranks(
    argv: list[str],
    world: int,
    folder: Path,
    *,
    env: dict | None = None,
    timeout_s: float = 90.0,
    wrap: Callable[[Callable[[], int]], int] | None = None,
) -> list[RankResult]:
    """Fork ``world`` ranks of ``entrain <argv>``; a rank still running after ``timeout_s`` is killed
    (exit code None). ``wrap(run)``, when given, runs in each rank around the CLI call ``run()`` and
    returns its exit code (to instrument the rank's process)."""
    folder.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("fork")
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(argv, r, world, port, str(folder), env or {}, wrap))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    results = []
    for r, p in enumerate(procs):
        code = p.exitcode
        if p.is_alive():
            p.kill()
            p.join()
            code = None
        results.append(
            RankResult(code, (folder / f"rank{r}.out").read_text(), (folder / f"rank{r}.err").read_text())
        )
    return results
