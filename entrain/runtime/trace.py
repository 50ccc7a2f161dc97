"""Traces of real runs (``entrain train --trace``): every action a rank's executor runs, with its
start and duration, written as Chrome trace events (``OUT/trace.json``, opens in Perfetto or
chrome://tracing).

``ActionTracer`` sits in ``Executor.run``'s action loop; rank 0 gathers every rank's events after
each step. Times are ``time.time()`` microseconds, one clock for the ranks of a machine (NTP-close
across machines); on a GPU each action is timed by a pair of CUDA events on the current stream
(``DeviceClock``: what the device ran, not when the host launched it), placed on that clock by an
anchor event recorded after a synchronisation at the step's start; each event's ``args`` carry the step, stage, microbatch, sub-microbatch and the
peer of a transfer. Compute actions (F, B, I, W) have category ``compute``, transfers (SEND_*,
RECV_*) ``comm``: a send's duration is the time to post it (transfers are asynchronous), a
receive's the wait for its message. Each rank's end of step (from its last action's end to the end of
its optimizer step: the wait for its sends and DP all-reduce, the loss and gradient-norm all-reduces,
clipping, the optimizer step) is a record of its own under the file's ``stepEnds`` key (category
``step_end``; not among ``traceEvents``, which hold actions only): ``read_step_ends``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from entrain.core.ir.plan import Action, ActionKind

__all__ = ["ActionTracer", "DeviceClock", "STEP_END", "write_trace", "read_trace", "read_step_ends"]

STEP_END = "step_end"
"""Category of a rank's end-of-step record (``ActionTracer.step_end``)."""


@dataclass
class ActionTracer:
    """Collects one rank's action events; ``drain`` hands them over (and forgets them)."""

    rank: int
    step: int = 0
    events: list[dict] = field(default_factory=list)
    clock: DeviceClock | None = None

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

    def step_end(self, start_us: float, end_us: float) -> None:
        """This rank's end of step: from its last action's end to the end of its optimizer step."""
        self.events.append(
            {
                "name": "end of step",
                "cat": STEP_END,
                "ph": "X",
                "ts": round(start_us, 1),
                "dur": round(max(end_us - start_us, 0.0), 1),
                "pid": self.rank,
                "tid": 2,
                "args": {"step": self.step},
            }
        )

    def start_step(self, device) -> None:
        """Called at the start of each executed step: on CUDA, anchor the device clock."""
        self.clock = DeviceClock.start() if device.type == "cuda" else None

    def begin(self):
        """A token for the start of an action: a recorded CUDA event, or the host time."""
        return self.clock.mark() if self.clock is not None else self.now_us()

    def end(self, a: Action, token, peer: int | None) -> None:
        if self.clock is None:
            self.add(a, token, self.now_us(), peer)
        else:
            self.clock.pending.append((a, token, self.clock.mark(), peer))

    def finish_step(self) -> None:
        """On CUDA: wait for the step's last event and add every action at its device times."""
        if self.clock is None:
            return
        for a, start_us, end_us, peer in self.clock.resolve():
            self.add(a, start_us, end_us, peer)

    def drain(self) -> list[dict]:
        out, self.events = self.events, []
        return out


@dataclass
class DeviceClock:
    """CUDA events of one step, read once at its end (no action waits for the device)."""

    anchor_us: float
    anchor: object
    pending: list[tuple[Action, object, object, int | None]] = field(default_factory=list)

    @classmethod
    def start(cls) -> DeviceClock:
        import torch

        torch.cuda.synchronize()  # the anchor event and the host clock refer to one instant
        clock = cls(time.time() * 1e6, cls._event())
        clock.anchor.record()
        return clock

    @staticmethod
    def _event():
        import torch

        return torch.cuda.Event(enable_timing=True)

    def mark(self):
        event = self._event()
        event.record()
        return event

    def resolve(self) -> list[tuple[Action, float, float, int | None]]:
        """(action, start_us, end_us, peer) of every marked action, on the host clock."""
        if not self.pending:
            return []
        self.pending[-1][2].synchronize()

        def at_us(event) -> float:
            return self.anchor_us + self.anchor.elapsed_time(event) * 1e3

        out = [(a, at_us(s), at_us(e), peer) for a, s, e, peer in self.pending]
        self.pending.clear()
        return out


def _names(ranks: list[int]) -> list[dict]:
    meta = []
    for r in ranks:
        meta.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}})
        meta.append({"name": "thread_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": "compute"}})
        meta.append({"name": "thread_name", "ph": "M", "pid": r, "tid": 1, "args": {"name": "comm"}})
    return meta


def write_trace(path: str, events: list[dict]) -> None:
    """``{"traceEvents": [...], "displayTimeUnit": "ms", "stepEnds": [...]}`` with one named process per
    rank; the ``STEP_END`` records under ``stepEnds``."""
    ranks = sorted({e["pid"] for e in events})
    actions = [e for e in events if e.get("cat") != STEP_END]
    ends = [e for e in events if e.get("cat") == STEP_END]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": _names(ranks) + actions, "displayTimeUnit": "ms", "stepEnds": ends}, f)
    os.replace(tmp, path)


def read_trace(path: str) -> list[dict]:
    """The action events (``ph == "X"``) of a trace.json."""
    with open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def read_step_ends(path: str) -> list[dict]:
    """The end-of-step records of a trace.json (none in a trace written before they were)."""
    with open(path) as f:
        return list(json.load(f).get("stepEnds", []))
