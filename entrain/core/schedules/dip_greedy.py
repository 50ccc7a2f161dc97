"""``dip-greedy``: DIP-like placement and sub-microbatches (``dip``) with DIP's greedy dual-queue
interleaver instead of the fixed phase order (``dip-greedy-mem``: the same under an in-flight window
that fits device memory, see ``greedy_orders``): whenever a rank is free it runs the next action of
its 1F1B-style preferred queue (``dip.phase_orders``) if that action's inputs exist, otherwise
the earliest (in queue order) action whose inputs already exist — filling bubbles with other
stages' work; if nothing is ready it waits for whatever becomes ready first. Timing for these
decisions comes from the cost model (``costs.PlanCosts``: compute and p2p times), as DIP's
planner uses its step emulator. The resulting per-rank orders are topological, so deadlock-free.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from entrain.core.costs.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.microbatches import IterationAssignment
from entrain.core.ir.plan import Action, ActionKind, Layout, Plan
from entrain.core.schedules import dip
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.schedules.common import ScheduleOptions
from entrain.core.schedules.predict import compute_deps
from entrain.core.workload.work import SampleWork

__all__ = ["generate", "greedy_orders", "budget_bytes", "message_reserve_bytes", "MEMORY_BOUNDED"]

NAME = "dip-greedy"
MEMORY_BOUNDED = "dip-greedy-mem"
"""The memory-bounded variant: the same interleaver under a per-rank in-flight window that fits."""


def _deps(graph: ReplicaGraph, costs: PlanCosts, a: Action) -> list[tuple[tuple, float]]:
    """(predecessor key, delay after its end) for a compute action (``predict.compute_deps``)."""
    return compute_deps(graph, costs, a)


def greedy_orders(
    graph: ReplicaGraph, costs: PlanCosts, budget_bytes: dict[int, float] | None = None
) -> dict[int, list[Action]]:
    """With ``budget_bytes`` (per pipeline rank: activation bytes it may hold), the in-flight window
    of ``dip-greedy-mem``: a rank admits microbatches in order, reserving the activations of all its
    chunks' (sub-)microbatches of that microbatch at its first forward there, and admits the next
    one only while the reservation fits the budget (or nothing is in flight); a microbatch's
    reservation is released when its last backward on the rank ends. Admission in order on every
    rank keeps the orders deadlock-free: the oldest unfinished microbatch is admitted everywhere."""
    queues = dip.phase_orders(graph)
    window = _Window(graph, costs, queues, budget_bytes) if budget_bytes is not None else None
    return _Interleaver(graph, costs, queues, window).run()


class _Interleaver:
    """The event loop of ``greedy_orders``: per rank, the queue actions whose inputs exist (``avail``:
    queue index -> ready time); a heap of each rank's next start."""

    def __init__(self, graph: ReplicaGraph, costs: PlanCosts, queues: dict, window: _Window | None):
        self.queues, self.window = queues, window
        self.key_of: dict[tuple[int, int], tuple] = {}
        self.info: dict[tuple, tuple] = {}  # key -> (rank, queue index, duration, deps)
        for rank, acts in queues.items():
            for i, a in enumerate(acts):
                k = ("F" if a.kind is ActionKind.F else "B", a.stage, a.mb, a.sub_index)
                self.key_of[(rank, i)] = k
                ids = graph.ids(a.stage, a.mb, a.sub_index)
                self.info[k] = (rank, i, costs.compute_ms(a.stage, a.kind, ids), _deps(graph, costs, a))
        self.succ: dict[tuple, list[tuple]] = {}
        self.unmet: dict[tuple, int] = {}
        for k, (_, _, _, deps) in self.info.items():
            self.unmet[k] = len(deps)
            for d, _ in deps:
                self.succ.setdefault(d, []).append(k)
        self.end: dict[tuple, float] = {}
        self.avail: dict[int, dict[int, float]] = {r: {} for r in queues}
        for k, n in self.unmet.items():
            if n == 0:
                rank, i = self.info[k][:2]
                self.avail[rank][i] = 0.0
        self.free = dict.fromkeys(queues, 0.0)
        self.head = dict.fromkeys(queues, 0)
        self.done_idx: dict[int, set[int]] = {r: set() for r in queues}
        self.out: dict[int, list[Action]] = {r: [] for r in queues}
        self.heap: list[tuple[float, int, int]] = []

    def candidate(self, rank: int) -> tuple[float, int] | None:
        """(start time, queue index) of the action ``rank`` runs next: its queue head if ready when the
        rank is free, else the earliest ready in queue order, else whatever becomes ready first."""
        cand = self.avail[rank]
        if self.window is not None:
            cand = {i: rt for i, rt in cand.items() if self.window.allows(rank, self.queues[rank][i])}
        if not cand:
            return None
        t, h = self.free[rank], self.head[rank]
        if h in cand and cand[h] <= t:
            return t, h
        now = [i for i, rt in cand.items() if rt <= t]
        if now:
            return t, min(now)
        t2 = min(cand.values())
        if h in cand and cand[h] <= t2:
            return t2, h
        return t2, min(i for i, rt in cand.items() if rt <= t2)

    def push(self, rank: int) -> None:
        c = self.candidate(rank)
        if c is not None:
            heapq.heappush(self.heap, (c[0], rank, c[1]))

    def run(self) -> dict[int, list[Action]]:
        for r in self.queues:
            self.push(r)
        while len(self.end) < len(self.info):
            if not self.heap:  # cannot happen: the oldest admitted microbatch can always run
                raise ConfigError("dip-greedy-mem: the in-flight window left no runnable action")
            start, rank, i = heapq.heappop(self.heap)
            if self.candidate(rank) != (start, i):  # stale entry
                continue
            for r in self.start(rank, i, start):
                self.push(r)
        return self.out

    def start(self, rank: int, i: int, start: float) -> set[int]:
        """Run queue action ``i`` of ``rank`` at ``start``; the ranks whose candidates changed."""
        k = self.key_of[(rank, i)]
        self.end[k] = self.free[rank] = start + self.info[k][2]
        del self.avail[rank][i]
        self.done_idx[rank].add(i)
        while self.head[rank] in self.done_idx[rank]:
            self.head[rank] += 1
        self.out[rank].append(self.queues[rank][i])
        if self.window is not None:
            self.window.ran(rank, self.queues[rank][i])
        touched = {rank}
        for s in self.succ.get(k, []):
            self.unmet[s] -= 1
            if self.unmet[s] == 0:
                srank, si, _, deps = self.info[s]
                self.avail[srank][si] = max(self.end[d] + delay for d, delay in deps)
                touched.add(srank)
        return touched


class _Window:
    """Per-rank in-order admission of microbatches under an activation budget (``greedy_orders``)."""

    def __init__(self, graph: ReplicaGraph, costs: PlanCosts, queues: dict, budget: dict[int, float]):
        self.budget = budget
        self.need: dict[tuple[int, int], float] = {}
        self.left: dict[tuple[int, int], int] = {}
        for rank, acts in queues.items():
            for a in acts:
                key = (rank, a.mb)
                if a.kind is ActionKind.F:
                    ids = graph.ids(a.stage, a.mb, a.sub_index)
                    self.need[key] = self.need.get(key, 0.0) + costs.activation_bytes(a.stage, ids)
                else:
                    self.left[key] = self.left.get(key, 0) + 1
        self.next = dict.fromkeys(queues, 0)
        self.held = dict.fromkeys(queues, 0.0)
        self.in_flight = dict.fromkeys(queues, 0)

    def allows(self, rank: int, a: Action) -> bool:
        if a.kind is not ActionKind.F or a.mb < self.next[rank]:
            return True
        if a.mb > self.next[rank]:
            return False
        need = self.need[(rank, a.mb)]
        return self.in_flight[rank] == 0 or self.held[rank] + need <= self.budget[rank]

    def ran(self, rank: int, a: Action) -> None:
        key = (rank, a.mb)
        if a.kind is ActionKind.F and a.mb == self.next[rank]:
            self.next[rank] += 1
            self.held[rank] += self.need[key]
            self.in_flight[rank] += 1
        elif a.kind is not ActionKind.F:
            self.left[key] -= 1
            if self.left[key] == 0:
                self.held[rank] -= self.need[key]
                self.in_flight[rank] -= 1


def budget_bytes(costs: PlanCosts, options: ScheduleOptions) -> dict[int, float]:
    """Activation bytes each pipeline rank may hold: ``dip_memory_budget_bytes`` (default: device
    memory) minus the rank's model state."""
    total = options.dip_memory_budget_bytes
    if total is None:
        total = costs.cost.hardware.device_memory_bytes
    return {r: total - costs.model_state_bytes(r) for r in range(costs.layout.ranks_per_replica)}


def generate(
    layout: Layout,
    assignments: Sequence[IterationAssignment],
    samples: dict[str, SampleWork],
    cost: CostModel | None = None,
    options: ScheduleOptions | None = None,
    system: str = NAME,
) -> Plan:
    opts = ScheduleOptions.from_any(options)
    bounded = system == MEMORY_BOUNDED

    def order_within(reserve: dict[int, float]):
        def order(costs: PlanCosts):
            budget = budget_bytes(costs, opts) if bounded else None
            if budget is not None:
                budget = {r: b - reserve.get(r, 0.0) for r, b in budget.items()}
            return lambda graph: greedy_orders(graph, costs, budget)

        return order

    plan = dip.generate(layout, assignments, samples, cost, opts, system=system, order=order_within({}))
    if not bounded or cost is None:
        return plan
    # the memory it fits counts point-to-point messages in flight too: plan again, the budget less the
    # most message bytes each rank holds in flight in the first plan
    reserve = message_reserve_bytes(plan, cost)
    return dip.generate(layout, assignments, samples, cost, opts, system=system, order=order_within(reserve))


def message_reserve_bytes(plan: Plan, cost: CostModel) -> dict[int, float]:
    """Per pipeline rank: the most bytes of messages it holds in flight at one step of ``plan``, over
    replicas and iterations (``entrain.core.costs.memory.in_flight_message_bytes``)."""
    from entrain.core.costs.memory import peak_in_flight_message_bytes, plan_message_bytes

    costs = PlanCosts(plan.layout, cost, plan.samples)
    out: dict[int, float] = {}
    for it in plan.iterations:
        peaks = peak_in_flight_message_bytes(plan.layout, it, plan_message_bytes(costs, it))
        for g, peak in peaks.items():
            r = plan.layout.replica_of(g)[1]
            out[r] = max(out.get(r, 0.0), peak)
    return out
