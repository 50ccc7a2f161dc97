"""Assignment off the critical path: each step's Plan is computed by one background
worker while earlier steps train; the step only waits for what is not ready yet.

``StepPlans.get(step)`` returns iteration ``step``'s Plan and first queues the Plans of the next
``lookahead`` steps on the worker (the loop asks for step N+1's Plan at the start of step N, to
prefetch its pixels, so a lookahead of 2 has N+1 ready from step N-1 on). Plans come from
``entrain.core.planning.steps`` (one global batch at a time, the first batch's run-wide options pinned),
so they equal the Plans computed in line.

The worker is a single background process by default (spawned: the training process holds torch
and gloo threads), fed each step's global batch (its samples' metadata) and returning the pickled
Plan. A thread (``ENTRAIN_PLAN_PREFETCH=thread``) would do the same work, but the assignment is Python
and numpy on small arrays that holds the GIL nearly all the time: measured in
``benchmarks/results/assignment_overhead.md``, a planning thread delays a Python-bound main thread
by about its own planning time, which is what the prefetch is there to hide. ``inline`` (or ``0``)
plans each step on the main thread (``benchmarks/assignment_overhead.py --runtime`` compares the
modes). ``ahead`` plans every step of the run in line at the first ``get``, so no planner shares the
CPU with the steps after it: the real paired passes (``benchmarks/cpu_paired.py``) measure the Plans'
execution that way, on a machine whose cores the training ranks already fill. A step's wait (``assignment_wait_ms`` in metrics.jsonl) is the time its ``get`` calls
blocked; in line it is the planning itself.

Failures: a worker error is raised by the ``get`` of its step, with its own type and message; a
worker process that dies fails that ``get`` (``BrokenProcessPool``), never a hang. ``close`` cancels
queued work and joins the worker. The steps before a resumed run's start are planned in the
background too (one per ``get``), so ``whole`` can write the complete ``plan.json`` at the end."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from entrain.core.costs.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.ir.p2p_check import check_plan, rules_from_env
from entrain.core.ir.plan import IterationPlan, Layout, Plan
from entrain.core.planning.steps import join_plans, pinned_options, plan_step
from entrain.core.systems import moves_across_replicas
from entrain.core.workload.work import SampleWork

__all__ = ["MODES", "StepPlanner", "StepPlans", "prefetch_mode"]

LOOKAHEAD = 2
MODES = ("process", "thread", "inline", "ahead")
"""Where the Plans are made: a background process (default), a background thread, in line per step,
or in line for every step at the first ``get`` (``ahead``)."""


def prefetch_mode() -> str:
    """``ENTRAIN_PLAN_PREFETCH``: ``process`` (default, also ``1``), ``thread``, ``inline`` (also ``0``) or
    ``ahead``."""
    value = os.environ.get("ENTRAIN_PLAN_PREFETCH", "process").strip().lower()
    value = {"1": "process", "0": "inline"}.get(value, value)
    if value not in MODES:
        raise ConfigError(f"ENTRAIN_PLAN_PREFETCH={value!r}: choose from {', '.join(MODES)} (or 1 / 0)")
    return value


@dataclass
class StepPlanner:
    """``(step, batch) -> one-iteration Plan`` of one global batch, checked deadlock-free
    (``entrain.core.ir.p2p``); the first batch's run-wide options are pinned on first use. Picklable:
    the background process gets one at its start and each step's batch with each task."""

    system: str
    layout: Layout
    cost: CostModel
    options: dict | None
    first_batch: list[SampleWork]
    pinned: dict | None = None

    def __call__(self, step: int, batch: Sequence[SampleWork]) -> Plan:
        first = None
        if self.pinned is None:
            first = plan_step(self.system, self.layout, self.first_batch, self.cost, self.options)
            self.pinned = pinned_options(first)
        if step == 0 and first is not None:
            out = first
        else:
            out = plan_step(self.system, self.layout, batch, self.cost, self.options, self.pinned)
        cross = moves_across_replicas(self.system, self.options)  # channels between replicas
        check_plan(out, rules_from_env(os.environ), cross)  # lazy connection; one GPU queue where set
        return out


PARENT_POLL_S = 0.5


def _serve(conn, planner: StepPlanner, parent_pid: int) -> None:
    """The background process: plan each ``(step, batch)`` it is sent, answer ``(step, ok, plan or
    error)``; leave when the pipe closes or the training process is gone (a rank killed by a fault or
    by torchrun must not leave its planner behind)."""
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    while True:
        try:
            step, batch = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send((step, True, planner(step, batch)))
        except Exception as e:  # handed to the step that asks for this Plan
            conn.send((step, False, e))


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


class _PipeFuture:
    def __init__(self, worker: _ProcessWorker, step: int):
        self._worker, self._step = worker, step

    def result(self) -> Plan:
        return self._worker.collect(self._step)


class _ProcessWorker:
    """One spawned planner process fed over a pipe. Not a ``ProcessPoolExecutor``: its queues hold
    semaphores that outlive a rank leaving by ``os._exit`` (``runtime.launcher``), and the resource tracker
    then prints warnings after the rank's one-line error; a pipe holds none."""

    def __init__(self, planner: StepPlanner):
        ctx = multiprocessing.get_context("spawn")  # never fork a process holding torch and gloo threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, planner, os.getpid()), daemon=True)
        self._proc.start()
        child.close()
        self._answers: dict[int, tuple[bool, object]] = {}

    def submit(self, step: int, batch: list[SampleWork]) -> _PipeFuture:
        self._conn.send((step, batch))
        return _PipeFuture(self, step)

    def collect(self, step: int) -> Plan:
        """Step ``step``'s Plan (answers come in the order asked; earlier ones are kept)."""
        while step not in self._answers:
            try:
                got, ok, value = self._conn.recv()
            except (EOFError, OSError):
                raise BrokenProcessPool(
                    f"the planner process died (exit code {self._proc.exitcode})"
                ) from None
            self._answers[got] = (ok, value)
        ok, value = self._answers.pop(step)
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Terminated, not drained: nothing it computes is needed any more, and a rank being shut
        down by torchrun must not wait for a Plan."""
        self._proc.terminate()
        self._proc.join()
        self._conn.close()


def _executor(mode: str, planner: StepPlanner) -> Executor | _ProcessWorker | None:
    if mode == "thread":
        return ThreadPoolExecutor(1, thread_name_prefix="entrain-plan")
    if mode == "process":
        return _ProcessWorker(planner)
    return None


class StepPlans:
    """Plans of steps ``0 .. len(batches) - 1`` by ``planner``, computed ahead by one background
    worker (``mode``: ``process`` or ``thread``) or in line (``inline``)."""

    def __init__(
        self,
        planner: Callable[[int, Sequence[SampleWork]], Plan],
        batches: Sequence[Sequence[SampleWork]],
        *,
        mode: str = "process",
        lookahead: int = LOOKAHEAD,
    ):
        self._planner, self._batches = planner, batches
        self.num_steps, self.lookahead = len(batches), lookahead
        self._pool = _executor(mode, planner) if mode in ("process", "thread") else None
        self._ahead = mode == "ahead"
        self._futures: dict[int, Future] = {}
        self._done: dict[int, Plan] = {}
        self._backfill: list[int] = []
        self._wait_ms = 0.0

    def get(self, step: int) -> IterationPlan:
        """Step ``step``'s iteration (waits for it; a worker error is raised here)."""
        return self._part(step).iterations[0]

    def backfill(self, start: int) -> None:
        """A run resumed at ``start``: plan the earlier steps in the background too (for ``whole``)."""
        self._backfill = list(range(min(start, self.num_steps)))

    def take_wait_ms(self) -> float:
        """Milliseconds ``get`` blocked since the last call (the step's ``assignment_wait_ms``)."""
        wait, self._wait_ms = self._wait_ms, 0.0
        return wait

    def whole(self) -> Plan:
        """Every step's Plan as one (``plan.json``); steps not planned yet are planned in line."""
        return join_plans([self._part(s) for s in range(self.num_steps)])

    def close(self) -> None:
        """Cancel queued work and join the worker: a thread finishes its running task; a process is
        terminated (``_ProcessWorker.close``)."""
        if isinstance(self._pool, _ProcessWorker):
            self._pool.close()
        elif self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _part(self, step: int) -> Plan:
        if step in self._done:
            return self._done[step]
        t0 = time.perf_counter()
        if self._ahead:
            for s in range(self.num_steps):  # in step order, as a background worker plans them
                if s not in self._done:
                    self._done[s] = self._planner(s, self._batches[s])
            part = self._done[step]
        elif self._pool is None:
            part = self._planner(step, self._batches[step])
        else:
            self._queue(step)
            part = self._futures.pop(step).result()
        self._wait_ms += (time.perf_counter() - t0) * 1e3
        self._done[step] = part
        return part

    def _queue(self, step: int) -> None:
        """Queue ``step`` and the next ``lookahead`` steps, then one step before a resumed start."""
        for s in range(step, min(step + self.lookahead, self.num_steps - 1) + 1):
            self._submit(s)
        if self._backfill:
            self._submit(self._backfill.pop(0))

    def _submit(self, step: int) -> None:
        if step not in self._done and step not in self._futures:
            if isinstance(self._pool, _ProcessWorker):
                self._futures[step] = self._pool.submit(step, list(self._batches[step]))
            else:
                self._futures[step] = self._pool.submit(self._planner, step, list(self._batches[step]))
