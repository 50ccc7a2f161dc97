"""Lowering: insert SEND/RECV actions into compute-only per-rank action lists.

A pure list-to-list pass (torch.distributed.pipelining's ``_add_send_recv`` idea). For every
message between stages on *different* ranks (``ReplicaGraph``):

* ``SEND`` goes right after the action that completes the message: the producing ``F`` for
  activations; for gradients the last (in the sender's list) ``B``/``I`` among the tasks whose
  backward the message needs (at the encoder -> LLM boundary several LLM tasks may feed one
  encoder message).
* ``RECV`` goes right before the first action on the receiving rank that consumes the message;
  several receives before one action are ordered by message label ``(mb, sub)``.

With several encoders one boundary action stands for one message per encoder
(``validate.messages_of``): the receives and sends of the encoders' messages of one label lower to one
action.

Messages between stages on the same rank need no action. Executors must match a receive to its
send by (kind, stage, mb, sub), not by arrival order: a rank's receives are ordered by its own
consumption, which can differ from the sender's send order when a rank holds several stages.
"""

from __future__ import annotations

from entrain.core.ir.graph import Message, ReplicaGraph
from entrain.core.ir.plan import Action, ActionKind

__all__ = ["add_comms", "strip_comms"]


def strip_comms(actions: tuple[Action, ...] | list[Action]) -> list[Action]:
    return [a for a in actions if a.kind.is_compute]


def add_comms(graph: ReplicaGraph, compute: dict[int, list[Action]]) -> dict[int, list[Action]]:
    """``compute``: per pipeline rank (within the replica) its compute-only order. Returns the
    lowered lists, same keys."""
    sends_after = _sends_after(graph, compute)
    out: dict[int, list[Action]] = {}
    for rank, actions in compute.items():
        received: set[Message] = set()
        lowered: list[Action] = []
        for i, a in enumerate(actions):
            needed = _inputs(graph, a)
            recvs = sorted(m for m in needed if graph.is_remote(m) and m not in received)
            received.update(recvs)
            lowered += dict.fromkeys(graph.recv_action(m) for m in recvs)
            lowered.append(a)
            lowered += dict.fromkeys(graph.send_action(m) for m in sends_after.get((rank, i), []))
        out[rank] = lowered
    return out


def _inputs(graph: ReplicaGraph, a: Action) -> list[Message]:
    if a.kind is ActionKind.F:
        return graph.fwd_inputs(a.stage, a.mb, a.sub_index)
    if a.kind in (ActionKind.B, ActionKind.I):
        return graph.bwd_inputs(a.stage, a.mb, a.sub_index)
    return []


def _sends_after(
    graph: ReplicaGraph, compute: dict[int, list[Action]]
) -> dict[tuple[int, int], list[Message]]:
    """(rank, index in its compute list) -> remote messages to send right after that action."""
    where: dict[tuple[str, int, int, int], tuple[int, int]] = {}
    for rank, actions in compute.items():
        for i, a in enumerate(actions):
            if a.kind is ActionKind.F:
                where[("F", a.stage, a.mb, a.sub_index)] = (rank, i)
            elif a.kind in (ActionKind.B, ActionKind.I):
                where[("B", a.stage, a.mb, a.sub_index)] = (rank, i)
    out: dict[tuple[int, int], list[Message]] = {}
    for msg in graph.all_messages():
        if not graph.is_remote(msg):
            continue
        if msg.kind == "F":
            pos = where.get(("F", msg.src, msg.mb, msg.sub))
        else:
            positions = [where.get(("B", *t)) for t in graph.bwd_producers(msg)]
            pos = None if not positions or None in positions else max(positions)
        if pos is not None:
            out.setdefault(pos, []).append(msg)
    for v in out.values():
        v.sort()
    return out
