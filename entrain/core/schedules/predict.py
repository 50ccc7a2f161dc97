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
    """(predecessor key ``(F|B|I, stage, mb, sub)``, delay after its end) of a compute action."""
    return _deps(graph, costs, graph.stage_ranks, a.kind, a.stage, a.mb, a.sub_index)


def _deps(
    graph: ReplicaGraph, costs: PlanCosts, rank: tuple[int, ...], kind: ActionKind, s: int, m: int, u: int
) -> list[tuple[Key, float]]:
    """``compute_deps`` of ``kind`` on (``s``, ``m``, ``u``), ``rank`` each stage's pipeline rank: a
    remote input arrives ``message_ms`` of the forward stage's message after its producer ended."""
    if kind is ActionKind.F:
        return [
            (("F", p, pm, pu), costs.message_ms(p, graph.ids(p, pm, pu)) if rank[p] != rank[s] else 0.0)
            for p, pm, pu in graph.fwd_sources(s, m, u)
        ]
    if kind is ActionKind.W:
        return [(("I", s, m, u), 0.0)]
    out: list[tuple[Key, float]] = [(("F", s, m, u), 0.0)]
    sources = graph.bwd_sources(s, m, u)
    if sources:
        delay = costs.message_ms(s, graph.ids(s, m, u)) if rank[sources[0][0]] != rank[s] else 0.0
        out += [(("B", *t), delay) for t in sources]
    return out


_LETTER = {ActionKind.F: "F", ActionKind.B: "B", ActionKind.I: "I", ActionKind.W: "W"}


def _work(
    graph: ReplicaGraph, costs: PlanCosts, acts: list[Action]
) -> list[tuple[Key, float, list[tuple[Key, float]]]]:
    """(key, duration, ``compute_deps``) of each compute action of ``acts``, in order."""
    rank, ids, compute_ms = graph.stage_ranks, graph.ids, costs.compute_ms
    out = []
    for a in acts:
        letter = _LETTER.get(a.kind)
        if letter is not None:
            s, m, u = a.stage, a.mb, a.sub_index
            out.append(
                (
                    (letter, s, m, u),
                    compute_ms(s, a.kind, ids(s, m, u)),
                    _deps(graph, costs, rank, a.kind, s, m, u),
                )
            )
    return out


def predicted_makespan_ms(graph: ReplicaGraph, costs: PlanCosts, orders: dict[int, list[Action]]) -> float:
    """Makespan (ms) of one replica's per-rank compute orders; ``inf`` if the orders deadlock."""
    work = {rank: _work(graph, costs, acts) for rank, acts in orders.items()}
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
