"""The cost model's predicted makespan of per-rank compute orders (no simulator needed).

Used by generators that choose between candidate orders (Entrain's ``ramp_microbatches="auto"``)
and by the greedy DIP interleaver for its dependency delays. Model, as ``entrain.sim.executor``'s
compute part: each rank runs its compute actions in order, one at a time; an action starts when the
rank is free and every input exists — a remote input ``latency + bytes / bandwidth`` after the
producing action ended (sends are asynchronous, links are not contended). No memory, no DP
all-reduce (the same for every order of one layout).
"""

from __future__ import annotations

from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.plan import Action, ActionKind
from entrain.core.schedules.action_costs import PlanCosts

__all__ = ["compute_deps", "predicted_makespan_ms"]

Key = tuple[str, int, int, int]


def compute_deps(graph: ReplicaGraph, costs: PlanCosts, a: Action) -> list[tuple[Key, float]]:
    """(predecessor key ``(F|B, stage, mb, sub)``, delay after its end) of a compute action."""
    u = a.sub_index
    out: list[tuple[Key, float]] = []
    if a.kind is ActionKind.F:
        for msg in graph.fwd_inputs(a.stage, a.mb, u):
            delay = _message_ms(graph, costs, msg.src, msg) if graph.is_remote(msg) else 0.0
            out.append((("F", msg.src, msg.mb, msg.sub), delay))
        return out
    if a.kind is ActionKind.W:
        return [(("I", a.stage, a.mb, u), 0.0)]
    out.append((("F", a.stage, a.mb, u), 0.0))
    for msg in graph.bwd_inputs(a.stage, a.mb, u):
        delay = _message_ms(graph, costs, msg.dst, msg) if graph.is_remote(msg) else 0.0
        out += [(("B", *t), delay) for t in graph.bwd_producers(msg)]
    return out


def _message_ms(graph: ReplicaGraph, costs: PlanCosts, fwd_stage: int, msg) -> float:
    return costs.message_ms(fwd_stage, graph.ids(fwd_stage, msg.mb, msg.sub))


_LETTER = {ActionKind.F: "F", ActionKind.B: "B", ActionKind.I: "I", ActionKind.W: "W"}


def _key(a: Action) -> Key:
    return (_LETTER[a.kind], a.stage, a.mb, a.sub_index)


def predicted_makespan_ms(graph: ReplicaGraph, costs: PlanCosts, orders: dict[int, list[Action]]) -> float:
    """Makespan (ms) of one replica's per-rank compute orders; ``inf`` if the orders deadlock."""
    work: dict[int, list[tuple[Key, float, list[tuple[Key, float]]]]] = {}
    for rank, acts in orders.items():
        work[rank] = [
            (
                _key(a),
                costs.compute_ms(a.stage, a.kind, graph.ids(a.stage, a.mb, a.sub_index)),
                compute_deps(graph, costs, a),
            )
            for a in acts
            if a.kind in _LETTER
        ]
    ptr = dict.fromkeys(work, 0)
    clock = dict.fromkeys(work, 0.0)
    end: dict[Key, float] = {}
    waiters: dict[Key, list[int]] = {}
    stack = sorted(work, reverse=True)
    while stack:
        rank = stack.pop()
        items = work[rank]
        while ptr[rank] < len(items):
            key, dur, deps = items[ptr[rank]]
            start, missing = clock[rank], None
            for d, delay in deps:
                e = end.get(d)
                if e is None:
                    missing = d
                    break
                if e + delay > start:
                    start = e + delay
            if missing is not None:
                waiters.setdefault(missing, []).append(rank)
                break
            clock[rank] = start + dur
            end[key] = clock[rank]
            stack.extend(waiters.pop(key, ()))
            if key[0] == "I":
                alias = ("B", *key[1:])
                end[alias] = clock[rank]
                stack.extend(waiters.pop(alias, ()))
            ptr[rank] += 1
    if any(ptr[r] < len(items) for r, items in work.items()):
        return float("inf")
    return max(clock.values(), default=0.0)
