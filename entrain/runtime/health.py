"""Which peer is missing: every rank posts where it is in the run's sequence of collectives to the
process group's key-value store, so a collective that fails (a peer died, or stalled past
``--timeout-s``) can name the ranks that never reached it and what they did last.

Every rank passes the same sequence of *gather points* (world-wide: a checkpoint's save and load
phases, the run's start), so a gather point's count is comparable across ranks. Between them a rank
also marks collectives of its own groups (its stage's DP all-reduce buckets, one FSDP reduce-scatter
per stage module it holds, ...), and those differ in number from rank to rank (an LLM rank of an
``entrain`` layout holds two stage modules, an encoder rank one): they never count toward a gather
point. ``mark(what)`` is one store write; ``gather_point(what)`` also waits (polling, at most
``timeout_s``) until every rank has reached the same gather point, and otherwise raises ``PeerError``
naming the missing ranks -- a barrier that says who it waited for. ``behind`` (naming the peers after a
failed collective) orders ranks by ``(gather points passed, marks since the last one)``.
The store lives outside the worker processes (torchrun's agent, or the test's
file), so a dead rank's last post stays readable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch.distributed as dist

from entrain.core.errors import EntrainError

__all__ = ["PeerError", "PeerWatch"]


_PREFIX = "entrain/progress/"
"""Store keys of the posts. A torchrun restart must get a fresh store (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``,
as the README says), or the previous attempt's posts would count; the restart count cannot key them,
since agents may restart their workers with different counts."""


class PeerError(EntrainError, RuntimeError):
    """A collective point that some peer ranks did not reach: names them and where they were."""

    def __init__(self, rank: int, what: str, behind: dict[int, str], cause: BaseException | None = None):
        self.rank, self.what, self.behind = rank, what, behind
        peers = "; ".join(f"rank {r} last reached {w!r}" for r, w in sorted(behind.items()))
        detail = ""
        if cause is not None:
            first = str(cause).splitlines()[0] if str(cause) else ""
            detail = f" ({type(cause).__name__}: {first})"
        super().__init__(
            f"rank {rank}: {what} failed: peer rank(s) {sorted(behind)} did not get there "
            f"(died, or stalled past --timeout-s): {peers}{detail}"
        )


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        return None


@dataclass
class PeerWatch:
    rank: int
    world_size: int
    timeout_s: float
    seq: int = 0
    """Marks since the last gather point (rank-local: differs between ranks)."""
    gathers: int = 0
    """Gather points reached (world-wide: equal on every rank that got there)."""
    last: str = "start"
    _store: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self._store is None:
            self._store = _store()

    def mark(self, what: str) -> None:
        """This rank reached collective point ``what`` (the next in its sequence)."""
        self.seq += 1
        self.last = what
        self._post()

    def _post(self) -> None:
        if self._store is not None:
            self._store.set(f"{_PREFIX}{self.rank}", f"{self.gathers}\t{self.seq}\t{self.last}")

    def _posted(self, rank: int) -> tuple[int, int, str]:
        key = f"{_PREFIX}{rank}"
        if self._store is None or not self._store.check([key]):
            return 0, 0, "start"
        gathers, seq, what = self._store.get(key).decode().split("\t", 2)
        return int(gathers), int(seq), what

    def behind(self, *, gather_only: bool = False) -> dict[int, str]:
        """Ranks that have not reached this rank's current point: ``{rank: what it reached last}``
        (``gather_only``: its last gather point)."""
        mine = (self.gathers, 0 if gather_only else self.seq)
        out = {}
        for r in range(self.world_size):
            if r != self.rank:
                gathers, seq, what = self._posted(r)
                if (gathers, 0 if gather_only else seq) < mine:
                    out[r] = what
        return out

    def gather_point(self, what: str, poll_s: float = 0.02) -> None:
        """Reach gather point ``what`` (the next world-wide one), then wait until every rank got there;
        PeerError naming the others after ``timeout_s``."""
        self.gathers += 1
        self.seq = 0
        self.last = what
        self._post()
        if self._store is None:
            return
        deadline = time.monotonic() + self.timeout_s
        while True:
            missing = self.behind(gather_only=True)
            if not missing:
                return
            if time.monotonic() > deadline:
                raise PeerError(self.rank, what, missing)
            time.sleep(poll_s)
