"""``ordered_map`` under ``worker_processes(2)`` runs the items in forked worker processes (not in the
caller), and a worker runs a nested ``ordered_map`` as a plain loop (a pool's daemon worker cannot
fork its own)."""

from __future__ import annotations

import os

from entrain.core.workers import ordered_map, worker_jobs, worker_processes


def _nested(_: int) -> tuple[int, int, list[int]]:
    return os.getpid(), worker_jobs(), ordered_map(lambda _: os.getpid(), range(3))


def test_items_run_in_forked_workers_that_never_fork_again():
    with worker_processes(2):
        pids = ordered_map(lambda _: os.getpid(), range(4))
        nested = ordered_map(_nested, range(2))
    assert os.getpid() not in pids
    for pid, jobs, inner in nested:
        assert pid != os.getpid() and jobs == 1 and inner == [pid] * 3
    assert worker_jobs() == 1 and ordered_map(lambda _: os.getpid(), range(2)) == [os.getpid()] * 2
