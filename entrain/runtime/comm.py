"""Variable-shape point-to-point transport with the metadata sent first.

Every message is two transfers, sent together in one ``batch_isend_irecv``: a fixed ``int64[8]``
header ``[key, dtype, ndim, d0, d1, d2, d3, ids_crc]`` and then the contiguous data. Where the Plan
fixes the shape (a gradient has the shape of the forward output it belongs to) and the peer's
messages come in the order they are asked for, the receiver posts header and data together and only
checks the header at the end of the step (no host synchronisation per message); otherwise it
allocates from the header, which costs one host synchronisation on a GPU. Either way it checks the
key (which stage / direction / microbatch / sub) and the CRC of the sample ids it expects, so a
schedule mismatch is a clear error instead of a gloo abort or silent corruption. Sends never block:
gloo's ``send`` is a rendezvous that deadlocks two ranks sending to each other; the (work, tensors)
pairs are kept until ``wait_all`` at the end of the step. Receives match by key, not arrival order: a message
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

    in_order: frozenset[int] = frozenset()
    """Peers (plan ranks) whose messages this step arrive in the order this rank receives them (the
    executor derives it from the Plan's action lists)."""
    checks: list[tuple[int, MessageKey, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    """(peer, key, header received, header expected) of the messages received with a known shape,
    compared in ``wait_all`` (one host synchronisation per step, not per message)."""

    def _header(self, tensor: torch.Tensor, key: MessageKey, ids: Sequence[str]) -> torch.Tensor:
        if tensor.dim() > _MAX_DIMS:
            raise ValueError(f"{key}: tensors of at most {_MAX_DIMS} dims, got {tuple(tensor.shape)}")
        dims = list(tensor.shape) + [0] * (_MAX_DIMS - tensor.dim())
        values = [key.code, _DTYPES.index(tensor.dtype), tensor.dim(), *dims, ids_checksum(ids)]
        header = torch.tensor(values, dtype=torch.int64)
        if self.device.type == "cuda":
            return header.pin_memory().to(self.device, non_blocking=True)
        return header.to(self.device)

    def _process(self, peer: int) -> int:
        return self.peer_rank(peer) if self.peer_rank is not None else peer

    def send(self, tensor: torch.Tensor, peer: int, key: MessageKey, ids: Sequence[str]) -> None:
        """Header and data in one ``batch_isend_irecv``; the tensors are kept until ``wait_all``."""
        pair = (self._header(tensor, key, ids), tensor.contiguous())
        dst = self._process(peer)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, dst) for t in pair])
        self.pending.extend((w, pair) for w in works)

    def recv(
        self, peer: int, key: MessageKey, ids: Sequence[str], like: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Blocking receive of message ``key`` from ``peer``. ``like``: a tensor of the message's
        shape and dtype when the Plan fixes them (a gradient has its forward output's). Then, if
        ``peer`` is ``in_order``, header and data are received in one batch and the header is only
        checked (``wait_all``). Otherwise the header comes first and sizes the data; messages from
        ``peer`` arrive in its send order, and any that arrive before ``key`` are kept for later
        receives (matching by key, not order)."""
        if like is not None and peer in self.in_order and not any(p == peer for p, _ in self.stash):
            return self._recv_known(peer, key, ids, like)
        src = self._process(peer)
        while (peer, key.code) not in self.stash:
            header = torch.empty(_HEADER_LEN, dtype=torch.int64, device=self.device)
            dist.recv(header, src)
            code, dtype_idx, ndim, *rest = header.tolist()  # sizes the buffer: the one host sync
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

    def _recv_known(self, peer: int, key: MessageKey, ids: Sequence[str], like: torch.Tensor) -> torch.Tensor:
        header = torch.empty(_HEADER_LEN, dtype=torch.int64, device=self.device)
        data = torch.empty(like.shape, dtype=like.dtype, device=self.device)
        src = self._process(peer)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, t, src) for t in (header, data)]):
            work.wait()
        self.checks.append((peer, key, header, self._header(like, key, ids)))
        return data

    def verify(self) -> None:
        """Compare the headers of the messages received with a known shape (one host sync)."""
        if not self.checks:
            return
        got = torch.stack([c[2] for c in self.checks])
        want = torch.stack([c[3] for c in self.checks])
        bad = (got != want).any(dim=1).tolist()
        checks, self.checks = self.checks, []
        for (peer, key, header, expected), wrong in zip(checks, bad):
            if wrong:
                raise RuntimeError(
                    f"rank {dist.get_rank()}: message {key} from rank {peer} has header {header.tolist()}, the "
                    f"Plan says {expected.tolist()} (key, dtype, ndim, dims, ids crc): a schedule mismatch"
                )

    def wait_all(self) -> None:
        """Wait for every pending send (end of a step, and before shutdown)."""
        timeout = timedelta(seconds=self.timeout_s) if self.timeout_s is not None else None
        for work, _ in self.pending:
            if timeout is None:
                work.wait()
            else:
                work.wait(timeout)
        self.pending.clear()
        self.verify()
        if self.stash:
            raise RuntimeError(
                f"rank {dist.get_rank()}: received messages no action consumed: {sorted(self.stash)}"
            )
