"""The errors a rank raises when its step fails: an action of the Plan (``ExecutionError``),
connecting its point-to-point channels before the first step (``WarmUpError``), or a collective
outside the actions (``CollectiveError``); each names the rank, what it was doing and, when known,
the peer."""

from __future__ import annotations

from entrain.core.errors import EntrainError
from entrain.core.ir.plan import Action

__all__ = ["CollectiveError", "ExecutionError", "WarmUpError", "cause_line"]


def cause_line(cause: BaseException) -> str:
    """``Type: first non-empty line`` of an error, then its own cause's when it wraps one (torch's
    pipelining wraps the real error in a message that starts with a blank line)."""
    lines = [x.strip() for x in str(cause).splitlines() if x.strip()]
    text = f"{type(cause).__name__}: {lines[0] if lines else ''}"
    return text if cause.__cause__ is None else f"{text} <- {cause_line(cause.__cause__)}"


class ExecutionError(EntrainError, RuntimeError):
    """An action failed (a peer died or stalled past the process-group timeout, a schedule mismatch):
    names the rank, the action (stage, microbatch, sub) and the peer rank."""

    def __init__(self, rank: int, action: Action, peer: int | None, cause: BaseException):
        self.rank, self.action, self.peer = rank, action, peer
        with_peer = f" with rank {peer}" if peer is not None else ""
        super().__init__(
            f"rank {rank}: action {action} (stage {action.stage}, microbatch {action.mb}, sub "
            f"{action.sub_index}){with_peer} failed: {cause_line(cause)}"
        )


class WarmUpError(EntrainError, RuntimeError):
    """Connecting a rank's point-to-point channels before its first step failed (a peer died or
    stalled past the process-group timeout before it got there)."""

    def __init__(self, rank: int, cause: BaseException):
        self.rank = rank
        super().__init__(
            f"rank {rank}: connecting its point-to-point channels before its first step failed (a peer rank "
            f"died or stalled past --timeout-s): {cause_line(cause)}"
        )


class CollectiveError(EntrainError, RuntimeError):
    """A collective outside the pipeline actions failed (a peer died or stalled past the timeout):
    names the rank, the step, what the collective was for and, when known, the peers that never
    reached it (``entrain.runtime.health.PeerWatch``)."""

    def __init__(
        self, rank: int, step: int, what: str, cause: BaseException, behind: dict[int, str] | None = None
    ):
        self.rank, self.step, self.what, self.behind = rank, step, what, behind or {}
        who = "a peer rank died or stalled past --timeout-s"
        if self.behind:  # from the PeerWatch board: the ranks that never reached this collective
            who = "; ".join(
                f"rank {r} did not get there, it last reached {w!r}" for r, w in sorted(self.behind.items())
            )
            who += " (died, or stalled past --timeout-s)"
        super().__init__(f"rank {rank}: step {step}: {what} failed: {who}: {cause_line(cause)}")
