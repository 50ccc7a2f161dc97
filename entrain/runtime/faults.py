"""Fault injection for the reliability tests (hidden; not a user feature).

``ENTRAIN_FAULT="KIND:RANK:STEP[:SECONDS]"`` makes rank ``RANK`` misbehave in the middle of 0-based
step ``STEP`` (after the step's first collective, before its pipeline actions, so its peers are
waiting on it): ``kill`` sends itself SIGKILL, ``stall`` sleeps ``SECONDS`` (default 30), ``raise``
raises ``InjectedFault``. It fires only in a run that started fresh (not resumed from a checkpoint)
and on torchrun's first attempt (``TORCHELASTIC_RESTART_COUNT`` unset or 0), so the restarted or
resumed run goes through.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from entrain.core.errors import EntrainError

__all__ = ["Fault", "InjectedFault", "fault_from_env"]

ENV = "ENTRAIN_FAULT"


class InjectedFault(EntrainError):
    """Raised by a ``raise`` fault."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    rank: int
    step: int
    seconds: float = 30.0

    def maybe_fire(self, rank: int, step: int) -> None:
        if rank != self.rank or step != self.step:
            return
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "stall":
            time.sleep(self.seconds)
        else:
            raise InjectedFault(f"rank {rank}: injected fault at step {step} ({ENV})")


def fault_from_env(*, resumed: bool) -> Fault | None:
    text = os.environ.get(ENV)
    if not text or resumed or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"):
        return None
    parts = text.split(":")
    if len(parts) not in (3, 4) or parts[0] not in ("kill", "stall", "raise"):
        raise ValueError(f"{ENV}={text!r}: expected KIND:RANK:STEP[:SECONDS] with KIND kill|stall|raise")
    seconds = float(parts[3]) if len(parts) == 4 else 30.0
    return Fault(parts[0], int(parts[1]), int(parts[2]), seconds)
