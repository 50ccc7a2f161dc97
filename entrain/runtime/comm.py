"""Variable-shape point-to-point transport with the metadata sent first.

Every message is two transfers: a fixed ``int64[8]`` header ``[key, dtype, ndim, d0, d1, d2, d3,
ids_crc]`` and then the contiguous data. The receiver allocates from the header and checks the key
(which stage / direction / microbatch / sub) and the CRC of the sample ids it expects, so a schedule
mismatch is a clear error instead of a gloo abort or silent corruption. Sends are ``isend``: gloo's
``send`` is a rendezvous that deadlocks two ranks sending to each other; the (work, tensor) pairs are
kept until ``wait_all`` at the end of the step. Receives match by key, not arrival order: a message
that arrives before the awaited one is stashed (its header says its size), so a rank holding several
stages may consume a peer's messages in another order than they were sent, on gloo and NCCL alike.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["MessageKey", "Transport", "ids_checksum"]

_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64]
_HEADER_LEN = 8
_MAX_DIMS = 4


@dataclass(frozen=True, slots=True)
class MessageKey:
    """A message of sender stage ``stage``: forward output (``backward=False``) or input gradient."""

    stage: int
    backward: bool
    mb: int
    sub: int

    @property
    def code(self) -> int:
        return ((self.stage * 2 + int(self.backward)) * 4096 + self.mb) * 64 + self.sub

    def __str__(self) -> str:
        kind = "B" if self.backward else "F"
        return f"{self.stage}SEND_{kind}{self.mb}.{self.sub}"


def ids_checksum(ids: Sequence[str]) -> int:
    return zlib.crc32("\x1f".join(ids).encode())


@dataclass
class Transport:
    device: torch.device
    timeout_s: float | None = None
    """Longest wait for a pending send in ``wait_all`` (None: the process group's timeout)."""
    peer_rank: Callable[[int], int] | None = None
    """Process rank of a peer named by its plan rank (TP rank t talks to TP rank t; None: the same)."""
    pending: list[tuple[object, torch.Tensor]] = field(default_factory=list)
    stash: dict[tuple[int, int], tuple[int, torch.Tensor]] = field(default_factory=dict)
    """(peer, key code) -> (ids crc, data) of messages that arrived before the one being waited for."""

    def send(self, tensor: torch.Tensor, peer: int, key: MessageKey, ids: Sequence[str]) -> None:
        if tensor.dim() > _MAX_DIMS:
            raise ValueError(f"{key}: tensors of at most {_MAX_DIMS} dims, got {tuple(tensor.shape)}")
        dims = list(tensor.shape) + [0] * (_MAX_DIMS - tensor.dim())
        header = torch.tensor(
            [key.code, _DTYPES.index(tensor.dtype), tensor.dim(), *dims, ids_checksum(ids)],
            dtype=torch.int64,
            device=self.device,
        )
        dst = self.peer_rank(peer) if self.peer_rank is not None else peer
        for t in (header, tensor.contiguous()):
            self.pending.append((dist.isend(t, dst), t))

    def recv(self, peer: int, key: MessageKey, ids: Sequence[str]) -> torch.Tensor:
        """Blocking receive of message ``key`` from ``peer``. Messages from ``peer`` arrive in its send
        order; any that arrive before ``key`` are kept for later receives (matching by key, not order)."""
        src = self.peer_rank(peer) if self.peer_rank is not None else peer
        while (peer, key.code) not in self.stash:
            header = torch.empty(_HEADER_LEN, dtype=torch.int64, device=self.device)
            dist.recv(header, src)
            code, dtype_idx, ndim, *rest = header.tolist()
            data = torch.empty(rest[:ndim], dtype=_DTYPES[dtype_idx], device=self.device)
            dist.recv(data, src)
            if (peer, code) in self.stash:
                raise RuntimeError(
                    f"rank {dist.get_rank()}: message code {code} from rank {peer} arrived twice"
                )
            self.stash[(peer, code)] = (rest[_MAX_DIMS], data)
        crc, data = self.stash.pop((peer, key.code))
        if crc != ids_checksum(ids):
            raise RuntimeError(
                f"rank {dist.get_rank()}: message {key} from rank {peer} carries other sample ids than the "
                f"plan's {list(ids)}"
            )
        return data

    def wait_all(self) -> None:
        """Wait for every pending send (end of a step, and before shutdown)."""
        timeout = timedelta(seconds=self.timeout_s) if self.timeout_s is not None else None
        for work, _ in self.pending:
            if timeout is None:
                work.wait()
            else:
                work.wait(timeout)
        self.pending.clear()
        if self.stash:
            raise RuntimeError(
                f"rank {dist.get_rank()}: received messages no action consumed: {sorted(self.stash)}"
            )
