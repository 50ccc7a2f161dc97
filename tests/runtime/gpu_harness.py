"""Spawned workers for the ``gpu`` tests: one process per GPU (``LOCAL_RANK`` = its rank, so the
runtime puts it on ``cuda:RANK`` with NCCL), started with the ``spawn`` context because CUDA cannot
be used in a child forked from a parent that initialised it (``tests/runtime/harness.py`` forks gloo
workers instead). The parent never touches CUDA: workers return their results with every tensor
moved to the CPU. Without CUDA the same workers run on the CPU with gloo (what the CPU test of this
module exercises). Keep this module light: every spawned worker imports it."""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import pickle
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch


def cpu_tensors(obj):
    """``obj`` with every tensor in its lists, tuples and dicts moved to the CPU (detached)."""
    return torch.utils._pytree.tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, obj)


def exact_fp32() -> None:
    """No TF32 in matmuls or convolutions (cuDNN allows it by default): fp32 tolerances then hold."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _spawned(fn: Callable, rank: int, world: int, folder: str, args: tuple, pg_timeout_s: float) -> None:
    try:
        outcome = ("ok", _run_rank(fn, rank, world, folder, args, pg_timeout_s))
    except BaseException:  # noqa: BLE001 - reported to the parent
        outcome = ("error", traceback.format_exc())
    (Path(folder) / f"rank{rank}.pkl").write_bytes(pickle.dumps(outcome))
    os._exit(0 if outcome[0] == "ok" else 1)


def _run_rank(fn: Callable, rank: int, world: int, folder: str, args: tuple, pg_timeout_s: float):
    """``fn(env, *args)`` on this rank's device (``cuda:RANK`` and NCCL where torch sees a GPU), the
    result's tensors on the CPU."""
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["LOCAL_WORLD_SIZE"] = str(world)
    # the suite forces the CPU (conftest); a GPU worker asks for CUDA where torch sees one
    os.environ["ENTRAIN_DEVICE"] = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(1)
    exact_fp32()
    from entrain.runtime.distributed import init_distributed, shutdown

    env = init_distributed(
        timeout_s=pg_timeout_s, rank=rank, world_size=world, init_method=f"file://{folder}/store"
    )
    want = "nccl" if torch.cuda.is_available() else "gloo"
    if env.backend != want:
        raise AssertionError(f"rank {rank}: the runtime chose {env.backend} on {env.device}, expected {want}")
    result = cpu_tensors(fn(env, *args))
    shutdown()
    return result


def run_spawned(
    fn: Callable, world: int, folder: Path, *args, timeout_s: float = 180.0, pg_timeout_s: float = 120.0
) -> list:
    """Run ``fn(env, *args)`` on ``world`` spawned ranks (``fn`` and ``args`` must pickle: a module-
    level function); returns each rank's result. Ranks that fail raise their tracebacks here (all
    of them: the first rank's is often only its peer's disconnection); a group still running after
    ``timeout_s`` is killed and fails."""
    folder.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_spawned, args=(fn, r, world, str(folder), args, pg_timeout_s))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    hung = _wait_or_kill(procs, timeout_s)
    files = [folder / f"rank{r}.pkl" for r in range(world)]
    missing = [r for r, f in enumerate(files) if not f.exists()]
    if missing:
        codes = [p.exitcode for p in procs]
        raise AssertionError(
            f"ranks {missing} produced no result (killed after {timeout_s} s: {hung}; exit codes {codes})"
        )
    outcomes = [pickle.loads(f.read_bytes()) for f in files]
    failed = [f"rank {r} failed:\n{value}" for r, (status, value) in enumerate(outcomes) if status != "ok"]
    if failed:
        raise AssertionError("\n".join(failed))
    return [value for _, value in outcomes]


def _wait_or_kill(procs: list, timeout_s: float) -> list[int]:
    """Wait for every process until one common deadline; kill those still running (returned)."""
    deadline = time.monotonic() + timeout_s
    running = {p.sentinel: r for r, p in enumerate(procs)}
    while running and (left_s := deadline - time.monotonic()) > 0:
        for done in mp_connection.wait(list(running), timeout=left_s):
            procs[running.pop(done)].join()
    for r in running.values():
        procs[r].kill()
        procs[r].join()
    return sorted(running.values())


def each_scenario(scenarios: dict[str, Callable[[], object]]) -> dict[str, tuple[str, object]]:
    """Run every scenario (in one worker) and keep going after a failure: per name ``("ok", value)``
    or ``("error", traceback)``, so each test reports its own scenario."""
    out = {}
    for name, run in scenarios.items():
        try:
            out[name] = ("ok", run())
        except Exception:  # noqa: BLE001 - reported by the test that reads this scenario
            out[name] = ("error", traceback.format_exc())
    return out


def scenario(results: dict[str, tuple[str, object]], name: str):
    """A scenario's value from ``each_scenario``; its traceback fails the calling test."""
    status, value = results[name]
    if status != "ok":
        raise AssertionError(f"scenario {name} failed in the worker:\n{value}")
    return value
