"""Traces of real runs (``entrain train --trace``): every action a rank's executor runs, with its
start and duration, written as Chrome trace events (``OUT/trace.json``, opens in Perfetto or
chrome://tracing).

``ActionTracer`` sits in ``Executor.run``'s action loop; rank 0 gathers every rank's events after
each step. Times are ``time.time()`` microseconds, one clock for the ranks of a machine (NTP-close
across machines); each event's ``args`` carry the step, stage, microbatch, sub-microbatch and the
peer of a transfer. Compute actions (F, B, I, W) have category ``compute``, transfers (SEND_*,
RECV_*) ``comm``: a send's duration is the time to post it (transfers are asynchronous), a
receive's the wait for its message.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from entrain.core.plan import Action, ActionKind

__all__ = ["ActionTracer", "write_trace", "read_trace"]


@dataclass
class ActionTracer:
    """Collects one rank's action events; ``drain`` hands them over (and forgets them)."""

    rank: int
    step: int = 0
    events: list[dict] = field(default_factory=list)

    @staticmethod
    def now_us() -> float:
        return time.time() * 1e6

    def add(self, a: Action, start_us: float, end_us: float, peer: int | None) -> None:
        kind = ActionKind(a.kind)
        args = {"step": self.step, "kind": kind.value, "stage": a.stage, "mb": a.mb, "sub": a.sub_index}
        if peer is not None:
            args["peer"] = peer
        self.events.append(
            {
                "name": f"{kind.value} s{a.stage} mb{a.mb}" + (f".{a.sub_index}" if a.sub_index else ""),
                "cat": "compute" if kind.is_compute else "comm",
                "ph": "X",
                "ts": round(start_us, 1),
                "dur": round(max(end_us - start_us, 0.0), 1),
                "pid": self.rank,
                "tid": 0 if kind.is_compute else 1,
                "args": args,
            }
        )

    def drain(self) -> list[dict]:
        out, self.events = self.events, []
        return out


def _names(ranks: list[int]) -> list[dict]:
    meta = []
    for r in ranks:
        meta.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}})
        meta.append({"name": "thread_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": "compute"}})
        meta.append({"name": "thread_name", "ph": "M", "pid": r, "tid": 1, "args": {"name": "comm"}})
    return meta


def write_trace(path: str, events: list[dict]) -> None:
    """``{"traceEvents": [...], "displayTimeUnit": "ms"}`` with one named process per rank."""
    ranks = sorted({e["pid"] for e in events})
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": _names(ranks) + events, "displayTimeUnit": "ms"}, f)
    os.replace(tmp, path)


def read_trace(path: str) -> list[dict]:
    """The action events (``ph == "X"``) of a trace.json."""
    with open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
