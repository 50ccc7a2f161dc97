"""Fault injection for the reliability tests (hidden; not a user feature).

``ENTRAIN_FAULT="KIND:RANK:STEP[:SECONDS[:PHASE]]"`` makes rank ``RANK`` misbehave: with PHASE
``step`` (the default) in the middle of 0-based step ``STEP`` (after the step's first collective,
before its pipeline actions, so its peers are waiting on it); with ``save`` while the checkpoint of
``STEP`` completed steps is saved (after every rank began the save, before the tensors are written);
with ``load`` while a resumed run loads the checkpoint of step ``STEP``. ``kill`` sends itself
SIGKILL, ``stall`` sleeps ``SECONDS`` (default 30), ``raise`` raises ``InjectedFault``. A ``step`` or
``save`` fault fires only in a run that started fresh (a ``load`` fault only in a resumed one) and on
torchrun's first attempt (``TORCHELASTIC_RESTART_COUNT`` unset or 0), so the restarted or resumed run
goes through.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from entrain.core.errors import EntrainError

__all__ = ["Fault", "InjectedFault", "fault_from_env"]

ENV = "ENTRAIN_FAULT"
PHASES = ("step", "save", "load")


class InjectedFault(EntrainError):
    """Raised by a ``raise`` fault."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    rank: int
    step: int
    seconds: float = 30.0
    phase: str = "step"

    def maybe_fire(self, rank: int, step: int, phase: str = "step") -> None:
        if rank != self.rank or step != self.step or phase != self.phase:
            return
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "stall":
            time.sleep(self.seconds)
        else:
            where = f"step {step}" if phase == "step" else f"the checkpoint {phase} of step {step}"
            raise InjectedFault(f"rank {rank}: injected fault at {where} ({ENV})")


def fault_from_env(*, resumed: bool) -> Fault | None:
    text = os.environ.get(ENV)
    if not text or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"):
        return None
    parts = text.split(":")
    phase = parts[4] if len(parts) == 5 else "step"
    if len(parts) not in (3, 4, 5) or parts[0] not in ("kill", "stall", "raise") or phase not in PHASES:
        raise ValueError(
            f"{ENV}={text!r}: expected KIND:RANK:STEP[:SECONDS[:PHASE]] with KIND kill|stall|raise and "
            f"PHASE {'|'.join(PHASES)}"
        )
    if resumed != (phase == "load"):
        return None
    seconds = float(parts[3]) if len(parts) >= 4 and parts[3] else 30.0
    return Fault(parts[0], int(parts[1]), int(parts[2]), seconds, phase)
