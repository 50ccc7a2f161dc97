"""Analytic 1F1B makespan of a sequence of microbatches with per-microbatch per-stage times.

Model: ``S`` stages in a chain (encoder stages then LLM stages), no communication time. Stage ``s``
(0-based) runs the non-interleaved 1F1B order: ``min(S - 1 - s, M)`` warm-up forwards, then
alternating one forward / one backward, then the remaining backwards. Recurrence: an operation
starts when the previous operation of its stage has ended and its input exists
(``F(m, s)`` after ``F(m, s-1)``; ``B(m, s)`` after ``B(m, s+1)``; ``B(m, S-1)`` after
``F(m, S-1)``); the makespan is the end of the last operation. The dependency graph depends only on
``(M, S)``: it is built once and evaluated level by level with numpy for many candidate
sequences at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["onef1b_makespan"]


@dataclass(frozen=True)
class _Graph:
    micro: np.ndarray  # per op: microbatch position
    column: np.ndarray  # per op: stage (forward) or S + stage (backward)
    prev: np.ndarray  # previous op on the same stage, or the sentinel index
    dep: np.ndarray  # cross-stage input op, or the sentinel index
    levels: tuple[np.ndarray, ...]


def _stage_ops(s: int, num_stages: int, m: int) -> list[tuple[str, int]]:
    warm = min(num_stages - 1 - s, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


@lru_cache(maxsize=256)
def _graph(m: int, num_stages: int) -> _Graph:
    index: dict[tuple[str, int, int], int] = {}
    micro, column, prev, dep, stage_lists = [], [], [], [], []
    for s in range(num_stages):
        ops = _stage_ops(s, num_stages, m)
        stage_lists.append(ops)
        for kind, i in ops:
            index[(kind, i, s)] = len(micro)
            micro.append(i)
            column.append(s if kind == "F" else num_stages + s)
    sentinel = len(micro)
    for s, ops in enumerate(stage_lists):
        last = sentinel
        for kind, i in ops:
            prev.append(last)
            last = index[(kind, i, s)]
            if kind == "F":
                dep.append(index[("F", i, s - 1)] if s > 0 else sentinel)
            else:
                dep.append(index[("B", i, s + 1)] if s < num_stages - 1 else index[("F", i, s)])
    prev_a, dep_a = np.array(prev, dtype=np.int64), np.array(dep, dtype=np.int64)
    done = np.zeros(sentinel + 1, dtype=bool)
    done[sentinel] = True
    order_levels: list[np.ndarray] = []
    remaining = np.arange(sentinel)
    while remaining.size:
        ready = remaining[done[prev_a[remaining]] & done[dep_a[remaining]]]
        if ready.size == 0:
            raise RuntimeError(f"1F1B dependency cycle for M={m}, S={num_stages}")  # cannot happen
        done[ready] = True
        order_levels.append(ready)
        remaining = remaining[~done[remaining]]
    return _Graph(np.array(micro), np.array(column), prev_a, dep_a, tuple(order_levels))


def onef1b_makespan(fwd_ms: np.ndarray, bwd_ms: np.ndarray) -> np.ndarray:
    """Makespan(s) of the 1F1B schedule.

    ``fwd_ms``/``bwd_ms``: shape ``(M, S)`` for one sequence (microbatches in execution order), or
    ``(P, M, S)`` for ``P`` candidate sequences evaluated together. Returns a float, or shape ``(P,)``.
    """
    fwd, bwd = np.asarray(fwd_ms, dtype=float), np.asarray(bwd_ms, dtype=float)
    single = fwd.ndim == 2
    if single:
        fwd, bwd = fwd[None], bwd[None]
    p, m, s = fwd.shape
    if m == 0:
        return 0.0 if single else np.zeros(p)
    g = _graph(m, s)
    dur = np.concatenate([fwd, bwd], axis=2)[:, g.micro, g.column]  # (P, ops)
    end = np.zeros((p, len(g.micro) + 1))
    for ops in g.levels:
        end[:, ops] = np.maximum(end[:, g.prev[ops]], end[:, g.dep[ops]]) + dur[:, ops]
    result = end[:, :-1].max(axis=1)
    return float(result[0]) if single else result
