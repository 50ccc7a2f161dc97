"""Variable-shape point-to-point transport: one group per channel, a header before the data.

The runtime issues the operations of ``entrain.core.ir.p2p.rank_program`` (checked deadlock-free under
NCCL's semantics by ``entrain.core.ir.p2p_check.check_program``). A message is one or more named parts
(``entrain.core.ir.plan.StageSpec.part_names``), each two transfers: a fixed ``int64[8]`` header
``[key, dtype, ndim, d0, d1, d2, d3, ids_crc]`` (the key names the part too) and then the contiguous
data; every part of a message travels on the group of its *channel* (the ordered pair sender -> receiver): a send holds only its channel's
communicator, never a receive from another rank, so NCCL's rendezvous cannot cross two ranks' sends.
A send posts every part's header and data in one ``batch_isend_irecv`` and does not wait; its tensors are held
while it is in flight and dropped once it has completed (``release_sent``, asked without waiting at
every send and receive; ``wait_all`` waits for the rest at the end of the step). A receive of known shape (a gradient has the shape of the
forward output it belongs to) posts every header and data together and checks the header at the end of the
step (no host synchronisation per message), and so does a forward message whose shape the executor
knows from the plan (``entrain.runtime.message_shapes.MessageShapes``); any other forward message's headers
come first and size the data (one host synchronisation on a GPU, counted in ``header_reads``). Either way the key (stage / direction / microbatch / sub) and
the CRC of the sample ids are checked, so a schedule mismatch is a clear error instead of a backend
abort or silent corruption. Receives follow the sender's order per channel (FIFO matching); a message
received ahead of the action that consumes it waits in ``stash``.

gloo runs the same semantics: its send is a rendezvous too (``tests/runtime/test_comm.py`` pins that a
send does not complete before its receive is posted), and its pairs match in order.

Pre-posted gradient receives (gloo only, ``Transport.prepost_gradients``): under the rendezvous the data
moves when the receiver posts, and on a CPU it is the *sender's* transport thread that moves it; its core
is busy with the sender's next compute action, so a receive posted at its action waited 2-5 ms for the
scheduler to run that thread (rank 0's gradient receives 22-33 ms per step on chartqa, against 1-5 ms
pre-posted; docs/profiling.md). The executor therefore posts a gradient's receive as soon as it may: once
the forward output it belongs to exists and every earlier message of the channel has been posted (the
channel's FIFO order, the program's receive order), and the receive action only waits for it. NCCL keeps
receiving at the action, the order its replay checks (``entrain.core.ir.p2p_check.check_program``).
``ENTRAIN_RECEIVE_ORDER=nccl`` makes gloo receive at the action too (``RECEIVE_ORDER_ENV``): tests
run the order a GPU run uses on the CPU (tests/runtime/test_nccl_receive_order.py).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from entrain.core.ir.p2p import Batch

__all__ = ["MessageKey", "Transport", "ids_checksum", "RECEIVE_ORDER_ENV"]

RECEIVE_ORDER_ENV = "ENTRAIN_RECEIVE_ORDER"
"""``nccl``: post every receive at its action, as on NCCL, even on gloo (no receive posted ahead)."""

_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64]
_HEADER_LEN = 8
_MAX_DIMS = 4


@dataclass(frozen=True, slots=True)
class MessageKey:
    """Part ``part`` (index in the message's part names) of a message of sender stage ``stage``:
    forward output (``backward=False``) or input gradient; ``to``: the stage an input gradient goes to,
    where the sender sends one per encoder pipeline (the first LLM stage of a plan with several; -1
    otherwise), so that two pipelines' gradients on one channel (their last stages on one rank) keep
    distinct keys."""

    stage: int
    backward: bool
    mb: int
    sub: int
    part: int = 0
    to: int = -1

    @property
    def code(self) -> int:
        base = (((self.stage * 2 + int(self.backward)) * 4096 + self.mb) * 64 + self.sub) * 64 + self.part
        return base + ((self.to + 1) << 40)

    def with_part(self, part: int) -> MessageKey:
        return MessageKey(self.stage, self.backward, self.mb, self.sub, part, self.to)

    def __str__(self) -> str:
        kind = "B" if self.backward else "F"
        text = f"{self.stage}SEND_{kind}{self.mb}.{self.sub}" + (f" to {self.to}" if self.to >= 0 else "")
        return text if self.part == 0 else f"{text}[part {self.part}]"


def ids_checksum(ids: Sequence[str]) -> int:
    return zlib.crc32("\x1f".join(ids).encode())


@dataclass
class Transport:
    device: torch.device
    timeout_s: float | None = None
    """Longest wait for a pending send in ``wait_all`` (None: the process group's timeout)."""
    peer_rank: Callable[[int], int] | None = None
    """Process rank of a peer named by its plan rank (TP rank t talks to TP rank t; None: the same)."""
    channel_group: Callable[[int, int], object] | None = None
    """The process group of channel (sender, receiver), both plan ranks (None: the default group)."""
    pending: list[tuple[object, tuple[torch.Tensor, ...]]] = field(default_factory=list)
    stash: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    """(peer, key code) -> data of messages received before the action that consumes them."""
    checks: list[tuple[int, MessageKey, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    """(peer, key, header received, header expected) of the messages received with a known shape,
    compared in ``wait_all`` (one host synchronisation per step, not per message)."""
    me: int = 0
    """This process's plan rank (names the channels it sends on)."""
    prepost_gradients: bool = False
    """Post gradient receives ahead of their actions (gloo; see the module docstring)."""
    preposted: dict[tuple[int, int], tuple[MessageKey, list, torch.Tensor, torch.Tensor]] = field(
        default_factory=dict
    )
    """(peer, key code) -> (key, works, header, data) of receives posted ahead of their action."""
    num_preposted: int = 0
    """Receives posted ahead so far (a count for tests and traces)."""
    warmed: bool = False
    """Whether every channel of this rank has been connected (``warm_up``)."""
    header_reads: int = 0
    """Receives whose headers were read on the host before their data could be posted (one host
    synchronisation each on a GPU): forward messages not yet sized from the plan."""

    def __post_init__(self) -> None:
        if os.environ.get(RECEIVE_ORDER_ENV, "").strip().lower() == "nccl":
            self.prepost_gradients = False

    def warm_up(self, batches: Sequence[Batch]) -> None:
        """Connect this rank's channels before the first step's messages (``entrain.core.ir.p2p.WarmUp``):
        one ``int64[1]`` per channel, in the global channel order the batches follow; a receive is
        waited for, a send kept until ``wait_all`` (as for any message). NCCL sets a pair up on its
        first operation and blocks the host until the peer posts on it too, which mid-step could wait
        on a rank that waits on this one."""
        for batch in batches:
            (op,) = batch.ops
            token = torch.zeros(1, dtype=torch.int64, device=self.device)
            try:
                works = self._batch(
                    dist.isend if op.send else dist.irecv, (token,), op.peer, self._group(*batch.group)
                )
                if not op.send:
                    self._wait(works)
            except Exception as e:
                src, dst = batch.group
                raise RuntimeError(f"the warm-up of channel {src} -> {dst}") from e
            self.pending.extend((w, (token,)) for w in works if op.send)
        self.warmed = True

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

    def _group(self, src: int, dst: int):
        return self.channel_group(src, dst) if self.channel_group is not None else None

    def _batch(self, op, tensors: Sequence[torch.Tensor], peer: int, group) -> list:
        return dist.batch_isend_irecv([dist.P2POp(op, t, self._process(peer), group) for t in tensors])

    def release_sent(self) -> None:
        """Drop the sends that have completed (their tensors with them): a sent tensor is held while
        its send is in flight, not to the end of the step. ``is_completed`` asks without waiting (NCCL
        queries the work's CUDA event; gloo's send says it completed only once waited on, so on the
        CPU the tensors stay to ``wait_all``); a completed send is waited on once more, which returns
        at once or raises its error."""
        done = [w for w, _ in self.pending if w.is_completed()]
        for work in done:
            work.wait()
        if done:
            finished = set(map(id, done))
            self.pending = [(w, t) for w, t in self.pending if id(w) not in finished]

    def send(self, tensor: torch.Tensor, peer: int, key: MessageKey, ids: Sequence[str]) -> None:
        """A one-part message (``send_parts``)."""
        self.send_parts([tensor], peer, key, ids)

    def send_parts(
        self, tensors: Sequence[torch.Tensor], peer: int, key: MessageKey, ids: Sequence[str]
    ) -> None:
        """Every part's header and data (part ``i``: ``tensors[i]``) in one batch on the channel to
        ``peer``; held until the send completes (``release_sent``, at every send and receive) or
        ``wait_all``."""
        self.release_sent()
        headers = [self._header(t, key.with_part(i), ids) for i, t in enumerate(tensors)]
        batch = (*headers, *(t.contiguous() for t in tensors))  # headers first: the receiver's order
        works = self._batch(dist.isend, batch, peer, self._group(self.me, peer))
        self.pending.extend((w, batch) for w in works)

    def receive(
        self, peer: int, key: MessageKey, ids: Sequence[str], like: torch.Tensor | None = None
    ) -> None:
        """A one-part message (``receive_parts``)."""
        self.receive_parts(peer, key, ids, 1, None if like is None else [like])

    def receive_parts(
        self,
        peer: int,
        key: MessageKey,
        ids: Sequence[str],
        num_parts: int,
        likes: Sequence[torch.Tensor] | None = None,
    ) -> None:
        """Receive the ``num_parts`` parts of message ``key`` from ``peer`` into ``stash`` (one entry
        per part, ``key.with_part(i)``): with ``likes`` (tensors of their shapes and dtypes), every
        header and data in one batch, the headers checked at ``wait_all``; without, the headers first,
        then the data they size, then each header's key and sample ids are checked."""
        self.release_sent()
        keys = [key.with_part(i) for i in range(num_parts)]
        if all((peer, k.code) in self.preposted for k in keys):
            entries = [self.preposted.pop((peer, k.code)) for k in keys]
            self._wait(list({id(w): w for _, works, _, _ in entries for w in works}.values()))
            datas = [data for *_, data in entries]
            self._expect(peer, keys, ids, [h for _, _, h, _ in entries], likes)
        elif likes is not None:
            datas = self._receive_known(peer, keys, ids, likes)
        else:
            datas = self._receive_sized(peer, keys, ids)
        for k, data in zip(keys, datas):
            if (peer, k.code) in self.stash:
                raise RuntimeError(f"rank {dist.get_rank()}: message {k} from rank {peer} arrived twice")
            self.stash[(peer, k.code)] = data

    def _expect(self, peer: int, keys, ids, headers, likes) -> None:
        for k, header, like in zip(keys, headers, likes):
            self.checks.append((peer, k, header, self._header(like, k, ids)))

    def _receive_known(self, peer: int, keys, ids, likes) -> list[torch.Tensor]:
        headers = [torch.empty(_HEADER_LEN, dtype=torch.int64, device=self.device) for _ in keys]
        datas = [torch.empty(t.shape, dtype=t.dtype, device=self.device) for t in likes]
        pairs = [*headers, *datas]
        self._wait(self._batch(dist.irecv, pairs, peer, self._group(peer, self.me)))
        self._expect(peer, keys, ids, headers, likes)
        return datas

    def _receive_sized(self, peer: int, keys, ids) -> list[torch.Tensor]:
        group = self._group(peer, self.me)
        headers = [torch.empty(_HEADER_LEN, dtype=torch.int64, device=self.device) for _ in keys]
        self._wait(self._batch(dist.irecv, headers, peer, group))
        self.header_reads += 1
        values = torch.stack(headers).tolist()  # sizes the buffers: the one host sync
        datas = [
            torch.empty(rest[:ndim], dtype=_DTYPES[dtype_idx], device=self.device)
            for _, dtype_idx, ndim, *rest in values
        ]
        self._wait(self._batch(dist.irecv, datas, peer, group))  # received before any check: the peer
        for k, (code, _, _, *rest) in zip(keys, values):  # must not wait on a failed rank
            self._check(peer, k, ids, code, rest[_MAX_DIMS])
        return datas

    def prepost(self, peer: int, key: MessageKey, like: torch.Tensor) -> None:
        """A one-part message (``prepost_parts``)."""
        self.prepost_parts(peer, key, [like])

    def prepost_parts(self, peer: int, key: MessageKey, likes: Sequence[torch.Tensor]) -> None:
        """Post the receive of every part of message ``key`` (part ``i`` of the shape and dtype of
        ``likes[i]``) from ``peer`` now, in one batch; its ``receive_parts`` then only waits. The caller
        posts in the channel's message order."""
        keys = [key.with_part(i) for i in range(len(likes))]
        headers = [torch.empty(_HEADER_LEN, dtype=torch.int64, device=self.device) for _ in keys]
        datas = [torch.empty(t.shape, dtype=t.dtype, device=self.device) for t in likes]
        pairs = [*headers, *datas]
        works = self._batch(dist.irecv, pairs, peer, self._group(peer, self.me))
        for k, header, data in zip(keys, headers, datas):
            self.preposted[(peer, k.code)] = (k, works, header, data)
        self.num_preposted += 1

    @staticmethod
    def _wait(works: list) -> None:
        for w in works:
            w.wait()

    def _check(self, peer: int, key: MessageKey, ids: Sequence[str], code: int, crc: int) -> None:
        if code != key.code:
            raise RuntimeError(
                f"rank {dist.get_rank()}: expected message {key} from rank {peer}, got message code {code}: "
                "a schedule mismatch"
            )
        if crc != ids_checksum(ids):
            raise RuntimeError(
                f"rank {dist.get_rank()}: message {key} from rank {peer} carries other sample ids than the "
                f"plan's {list(ids)}"
            )

    def take(self, peer: int, key: MessageKey) -> torch.Tensor:
        """The data of message ``key`` from ``peer``, received by an earlier ``receive``."""
        try:
            return self.stash.pop((peer, key.code))
        except KeyError:
            raise RuntimeError(
                f"rank {dist.get_rank()}: message {key} from rank {peer} was never received"
            ) from None

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
        """Wait for every pending send (end of a step, and before shutdown); a receive posted ahead and
        never taken is a schedule mismatch."""
        if self.preposted:
            keys = ", ".join(f"{key} from rank {peer}" for (peer, _), (key, *_) in self.preposted.items())
            self.preposted.clear()
            raise RuntimeError(f"rank {dist.get_rank()}: receives posted ahead were never taken: {keys}")
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
