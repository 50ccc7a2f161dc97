"""Worker processes for the planner's independent per-replica work.

``entrain plan`` spends nearly all its time generating and simulating replicas (Entrain's per-replica
candidate orders and their predicted makespans, then the executor), and replicas are independent.
``ordered_map`` runs such a per-item function in ``jobs`` forked worker processes and returns the
results in the items' order; outside ``worker_processes`` (and inside a worker) it is a plain loop.
The workers are forked at each call, so they see the caller's state (cost model, samples, closures)
without pickling it; only the results travel back (pickled exactly: the same floats and objects the
loop would return, so a plan is bitwise the same for any number of jobs; tests/sim/test_workers.py).

Fork is only safe in a process that has not started threads (torch, a data loader): only the
commands that plan (``entrain plan --jobs``) enable it.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["default_jobs", "worker_processes", "worker_jobs", "ordered_map"]

_jobs = 1
_task: tuple[Callable[[Any], Any], Sequence[Any]] | None = None


def default_jobs() -> int:
    """2, or the CPU count if lower."""
    return min(2, os.cpu_count() or 1)


@contextmanager
def worker_processes(jobs: int) -> Iterator[None]:
    """Within the block, ``ordered_map`` uses up to ``jobs`` forked worker processes (1: none)."""
    global _jobs
    before, _jobs = _jobs, max(1, int(jobs))
    try:
        yield
    finally:
        _jobs = before


def worker_jobs() -> int:
    """The worker processes ``ordered_map`` may use here (1: none)."""
    return _jobs


def _in_worker() -> None:
    global _jobs
    _jobs = 1  # a worker never forks again


def _call(index: int) -> Any:
    assert _task is not None
    fn, items = _task
    return fn(items[index])


def ordered_map(fn: Callable[[Any], Any], items: Sequence[Any]) -> list:
    """``[fn(x) for x in items]``, in worker processes when ``worker_processes`` allows more than one
    and there are at least two items (an exception in ``fn`` is raised here)."""
    jobs = min(_jobs, len(items))
    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [fn(x) for x in items]
    global _task
    _task = (fn, items)
    gc.freeze()  # the workers' collections leave the inherited objects' pages unshared (copy on write)
    try:
        with multiprocessing.get_context("fork").Pool(jobs, initializer=_in_worker) as pool:
            gc.unfreeze()
            return pool.map(_call, range(len(items)), chunksize=1)
    finally:
        gc.unfreeze()
        _task = None
