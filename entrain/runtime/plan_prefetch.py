"""Assignment off the critical path (issue 25 req. 2): each step's Plan is computed by one background
thread while earlier steps train, the step only waits for what is not ready yet.

``StepPlans.get(step)`` returns iteration ``step``'s Plan and first queues the Plans of the next
``lookahead`` steps on the worker (the loop asks for step N+1's Plan at the start of step N, to
prefetch its pixels, so a lookahead of 2 has N+1 ready from step N-1 on). Plans come from
``entrain.core.plan_steps`` (one global batch at a time, the first batch's run-wide options pinned),
so they equal the Plans computed in line, which ``background=False`` does (``ENTRAIN_PLAN_PREFETCH=0``;
``benchmarks/assignment_overhead.py --runtime`` compares both). The thread is enough: the
assignment's numpy work and the training step's torch ops release the GIL (measured in
``benchmarks/results/assignment_overhead.md``). A step's wait (``assignment_wait_ms`` in
metrics.jsonl) is the time its ``get`` calls blocked; in line it is the planning itself.

Failures: a worker error is raised by the ``get`` of its step, with its own type and message (never
a hang: the worker finishes each task); ``close`` cancels queued work and joins the thread. The
steps before a resumed run's start are planned in the background too (one per ``get``), so
``whole`` can write the complete ``plan.json`` at the end."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from entrain.core.costmodel import CostModel
from entrain.core.p2p import check_plan
from entrain.core.plan import IterationPlan, Layout, Plan
from entrain.core.plan_steps import join_plans, pinned_options, plan_step
from entrain.core.work import SampleWork

__all__ = ["StepPlans", "prefetch_enabled", "step_planner"]

LOOKAHEAD = 2


def prefetch_enabled() -> bool:
    """``ENTRAIN_PLAN_PREFETCH=0`` plans each step in line (for comparisons); on by default."""
    return os.environ.get("ENTRAIN_PLAN_PREFETCH", "1") != "0"


def step_planner(
    system: str,
    layout: Layout,
    batches: Sequence[Sequence[SampleWork]],
    cost: CostModel,
    options: dict | None,
) -> Callable[[int], Plan]:
    """``step -> one-iteration Plan`` of ``batches[step]``, checked deadlock-free
    (``entrain.core.p2p``); the first batch's run-wide options are pinned on first use."""
    pinned: list[dict] = []

    def plan(step: int) -> Plan:
        if pinned:
            out = plan_step(system, layout, batches[step], cost, options, pinned[0])
        else:
            first = plan_step(system, layout, batches[0], cost, options)
            pinned.append(pinned_options(first))
            out = first if step == 0 else plan_step(system, layout, batches[step], cost, options, pinned[0])
        check_plan(out)
        return out

    return plan


class StepPlans:
    """Plans of steps ``0 .. num_steps - 1`` by ``plan(step)``, computed ahead on one worker thread
    (``background``) or in line when asked."""

    def __init__(
        self,
        plan: Callable[[int], Plan],
        num_steps: int,
        *,
        background: bool = True,
        lookahead: int = LOOKAHEAD,
    ):
        self._plan, self.num_steps, self.lookahead = plan, num_steps, lookahead
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="entrain-plan") if background else None
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
        """Cancel queued work, join the worker (a running task finishes first)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _part(self, step: int) -> Plan:
        if step in self._done:
            return self._done[step]
        t0 = time.perf_counter()
        if self._pool is None:
            part = self._plan(step)
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
            self._futures[step] = self._pool.submit(self._plan, step)
