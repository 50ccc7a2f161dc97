"""The executor's point-to-point half (``entrain.runtime.executor.Executor`` subclasses
``MessagePassing``): the receives of a comm step (and the gradient receives posted ahead), the four
communication actions, and the pieces of encoder -> LLM boundary messages whose samples cross
replicas (``entrain.core.ir.p2p.encoder_pieces``)."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence

import torch

from entrain.core.ir.graph import Message
from entrain.core.ir.p2p import Comm, Step, message_part_names, receive_needs_header
from entrain.core.ir.plan import Action
from entrain.core.model.layer_specs import HIDDEN
from entrain.runtime.comm import MessageKey
from entrain.runtime.message_shapes import Parts

__all__ = ["MessagePassing", "receive_queues"]


class MessagePassing:
    """Receiving and sending a rank's messages: a half of ``Executor``, not used alone. It runs on the
    executor's state (``layout``, ``transport``, ``shapes``, the step's ``_it``, ``_pieces``,
    ``_outputs``, ``_messages``, ``_unposted``) and routing (``_next``, ``_prev``, ``_ids``, ``_peer``,
    ``_is_local``, ``_accept_input``, ``_accept_piece``, ``_input_leaf``, ``_leaves_from``,
    ``_handlers``)."""

    # --- receiving a comm step's messages -----------------------------------------------------------
    def _comm(self, c: Comm) -> None:
        """Receive what ``c``'s batches receive (its own message, and any sent before it on the same
        channel), then run the action (a send posts its message; a receive takes its from the stash)."""
        seen: set[tuple[int, Message]] = set()
        for batch in c.batches:
            for op in batch.ops:
                if not op.send and (op.peer, op.message) not in seen:
                    seen.add((op.peer, op.message))
                    self._receive(op.peer, op.message)
        self._handlers[c.action.kind](c.action)

    def _receive(self, peer: int, msg: Message) -> None:
        key, names = self._key(msg), message_part_names(self.layout, msg)
        ids = self._message_ids(peer, msg)
        if msg.kind == "F":  # sized from the plan once its stage's parts are known (MessageShapes)
            like = self.shapes.likes(msg.src, ids) if msg.src in self._sized else None
        else:  # the gradient has the shape and dtype of the output (piece) it belongs to
            like = self._gradient_likes(peer, msg)
        if (receive_needs_header(msg) and msg.src not in self._sized) != (like is None):
            raise RuntimeError(f"rank {self.rank}: {key}: the program and the executor disagree on its size")
        queue = self._unposted[peer]
        if queue and queue[0] == msg:
            queue.popleft()
        elif self._preposting and (peer, key.code) not in self.transport.preposted:
            raise RuntimeError(f"rank {self.rank}: {key} received out of its channel's order")
        self.transport.receive_parts(peer, key, ids, len(names), like)
        self._prepost(peer)

    def _prepost(self, peer: int) -> None:
        """Post, in the channel's order, the gradient receives from ``peer`` whose forward output exists
        (``Transport.prepost_gradients``; a no-op otherwise)."""
        queue = self._unposted[peer]
        while queue and queue[0].kind == "B" and (queue[0].dst, queue[0].mb, queue[0].sub) in self._outputs:
            msg = queue.popleft()
            self.transport.prepost_parts(peer, self._key(msg), self._gradient_likes(peer, msg))

    # --- pieces of boundary messages that cross replicas ----------------------------------------------
    def _message_ids(self, peer: int, msg: Message) -> tuple[str, ...]:
        """The samples a message between this rank and ``peer`` carries: its forward output's ids, or
        at the encoder -> LLM boundary where samples cross replicas, the piece for the LLM's replica."""
        out = msg.src if msg.kind == "F" else msg.dst
        if out != self.first_llm - 1 or not self._pieces:
            return self._ids(out, msg.mb, msg.sub)
        other = self.layout.replica_of(peer)[0]
        enc, llm = (self.replica, other) if out in self.modules else (other, self.replica)
        return self._piece_ids(enc, llm, msg.mb, msg.sub)

    def _piece_ids(self, enc: int, llm: int, mb: int, sub: int) -> tuple[str, ...]:
        """Ids of replica ``enc``'s encoder message (mb, sub) that replica ``llm`` owns, in order."""
        per = self._pieces.get((enc, mb, sub))
        if per is None:
            return self._it.microbatches[enc][mb].encoder_subs[sub] if enc == llm else ()
        return per.get(llm, ())

    def _piece_peers(self, stage: int, mb: int, sub: int) -> list[tuple[int, int]]:
        """(replica, plan rank) of the other replicas this rank exchanges pieces of message (mb, sub)
        with: at the last encoder stage the owners of its samples, at the first LLM stage the
        replicas that encoded some of its own (the program's order, ``entrain.core.ir.p2p``)."""
        if not self._pieces:
            return []
        e = self.first_llm - 1
        if stage == e:
            others = sorted(o for o in self._pieces.get((self.replica, mb, sub), {}) if o != self.replica)
            pp = self.layout.stages[e + 1].pp_rank
        else:
            others = sorted(r for (r, m, u), per in self._pieces.items()
                            if (m, u) == (mb, sub) and r != self.replica and self.replica in per)  # fmt: skip
            pp = self.layout.stages[e].pp_rank
        return [(r, self.layout.global_rank(r, pp)) for r in others]

    def _sample_rows(self, sid: str, name: str) -> int:
        """Rows of sample ``sid`` in part ``name`` of an encoder message (its audio tokens for an audio
        part, else its image feature rows)."""
        s = self.renderer.sample(sid)
        return s.audio_tokens if name in self._audio_parts else s.image_tokens

    def _row_index(self, ids: Sequence[str], subset: Sequence[str], name: str = HIDDEN) -> torch.Tensor:
        """Rows of the samples ``subset`` in part ``name`` of an encoder output of samples ``ids``."""
        spans, start = {}, 0
        for sid in ids:
            rows = self._sample_rows(sid, name)
            spans[sid], start = (start, start + rows), start + rows
        rows = [i for sid in subset for i in range(*spans[sid])]
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def _gradient_likes(self, peer: int, msg: Message) -> list[torch.Tensor]:
        """Tensors of the shapes and dtypes of gradient message ``msg``'s parts: its output's, or the
        rows of its piece where samples cross replicas."""
        out = self._outputs[(msg.dst, msg.mb, msg.sub)]
        names = message_part_names(self.layout, msg)
        if msg.dst != self.first_llm - 1 or (self.replica, msg.mb, msg.sub) not in self._pieces:
            return [out[n] for n in names]
        ids = self._message_ids(peer, msg)
        rows = {n: sum(self._sample_rows(sid, n) for sid in ids) for n in names}
        return [torch.empty((rows[n], *out[n].shape[1:]), dtype=out[n].dtype, device="meta") for n in names]

    def _gradient_to(self, sender: int, dst: int) -> int:
        """``MessageKey.to`` of the input gradient ``sender`` sends to stage ``dst``: ``dst`` where
        ``sender`` sends one per encoder pipeline, else -1."""
        return dst if len(self._prev[sender]) > 1 else -1

    def _key(self, msg: Message) -> MessageKey:
        to = self._gradient_to(msg.src, msg.dst) if msg.kind == "B" else -1
        return MessageKey(msg.src, msg.kind == "B", msg.mb, msg.sub, to=to)

    # --- communication ------------------------------------------------------------------------------
    def _send_forward(self, a: Action) -> None:
        s, mb, sub = a.stage, a.mb, a.sub_index
        if self._is_local(self._next[s]):
            return
        out = self._outputs[(s, mb, sub)]
        tensors = [t.detach() for t in out.values()]
        key, peers = MessageKey(s, False, mb, sub), self._piece_peers(s, mb, sub)
        if not peers:
            self.transport.send_parts(tensors, self._peer(self._next[s]), key, self._ids(s, mb, sub))
            self._prepost(self._peer(self._next[s]))
            return
        ids = self._ids(s, mb, sub)
        for replica, peer in [(self.replica, self._peer(s + 1)), *peers]:
            piece = self._piece_ids(self.replica, replica, mb, sub)
            cut = [t.index_select(0, self._row_index(ids, piece, n)) for n, t in zip(out, tensors)]
            self.transport.send_parts(cut, peer, key, piece)
            self._prepost(peer)

    def _take(
        self, stage: int, backward: bool, mb: int, sub: int, names: Sequence[str], to: int = -1
    ) -> Parts:
        """The parts ``names`` of message (``stage``: its sender; ``to``: ``MessageKey.to``) from the stash."""
        key, peer = MessageKey(stage, backward, mb, sub, to=to), self._peer(stage)
        return {n: self.transport.take(peer, key.with_part(i)) for i, n in enumerate(names)}

    def _recv_forward(self, a: Action) -> None:
        """Stage ``a.stage``'s input messages: from the stage before it, or at the first LLM stage of a
        plan with several encoders, from every encoder pipeline's last stage."""
        for src in self._prev[a.stage]:
            if not self._is_local(src):
                self._recv_forward_from(src, a.stage, a.mb, a.sub_index)

    def _recv_forward_from(self, src: int, s: int, mb: int, sub: int) -> None:
        names = self.layout.stages[src].part_names
        parts = self._take(src, False, mb, sub, names)
        if src not in self._sized:
            self.shapes.observe(src, self._message_ids(self._peer(src), Message("F", src, s, mb, sub)), parts)
        self._accept_input(s, mb, sub, parts, src)
        key = MessageKey(src, False, mb, sub)
        for replica, peer in self._piece_peers(s, mb, sub):
            piece = {n: self.transport.take(peer, key.with_part(i)) for i, n in enumerate(names)}
            if src not in self._sized:
                self.shapes.observe(src, self._piece_ids(replica, self.replica, mb, sub), piece)
            self._accept_piece(mb, sub, replica, piece)

    def _send_backward(self, a: Action) -> None:
        """The gradients of stage ``a.stage``'s inputs, each back to the stage it came from."""
        for src in self._prev[a.stage]:
            if not self._is_local(src):
                self._send_backward_to(src, a.stage, a.mb, a.sub_index)

    def _send_backward_to(self, src: int, s: int, mb: int, sub: int) -> None:
        leaves = self._leaves_from(src, s, mb, sub)
        grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves.values()]
        if s == self.first_llm:  # the rows of its encoder message that stayed on this replica
            ids = self._piece_ids(self.replica, self.replica, mb, sub)
        else:
            ids = self._ids(s, mb, sub)
        key, peers = (
            MessageKey(s, True, mb, sub, to=self._gradient_to(s, src)),
            self._piece_peers(s, mb, sub) if s == self.first_llm else [],
        )
        self.transport.send_parts(grads, self._peer(src), key, ids)
        for replica, peer in peers:
            leaves = self._messages[(mb, sub, replica)]
            grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves.values()]
            self.transport.send_parts(grads, peer, key, self._piece_ids(replica, self.replica, mb, sub))

    def _recv_backward(self, a: Action) -> None:
        s, mb, sub = a.stage, a.mb, a.sub_index
        if self._is_local(self._next[s]):
            return
        names = self.layout.stages[s].part_names
        grads = self._take(self._next[s], True, mb, sub, names, self._gradient_to(self._next[s], s))
        peers = self._piece_peers(s, mb, sub)
        if peers:  # the pieces' gradients back in the rows of the whole output
            out, ids, key = (
                self._outputs[(s, mb, sub)],
                self._ids(s, mb, sub),
                MessageKey(s + 1, True, mb, sub),
            )
            pieces = [(self.replica, grads)]
            for replica, peer in peers:
                pieces.append(
                    (replica, {n: self.transport.take(peer, key.with_part(i)) for i, n in enumerate(names)})
                )
            full = {n: torch.zeros_like(out[n]) for n in names}
            for replica, part in pieces:
                piece = self._piece_ids(self.replica, replica, mb, sub)
                for n in names:
                    full[n].index_copy_(0, self._row_index(ids, piece, n), part[n])
            grads = full
        self._out_grads[(s, mb, sub)] = grads


def receive_queues(program: Sequence[Step]) -> dict[int, deque[Message]]:
    """Per peer, the messages a rank's program receives from it, in order (as ``Executor._comm`` takes
    them): the order of the peer's sends on that channel."""
    queues: dict[int, deque[Message]] = defaultdict(deque)
    seen: set[tuple[int, Message]] = set()
    for step in program:
        if not isinstance(step, Comm):
            continue
        for op in (op for batch in step.batches for op in batch.ops if not op.send):
            if (op.peer, op.message) not in seen:
                seen.add((op.peer, op.message))
                queues[op.peer].append(op.message)
    return queues
