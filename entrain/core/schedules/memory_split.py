"""Entrain's memory split: an encoder (sub-)microbatch whose backward would overflow its rank is cut
into smaller sub-microbatches (docs/cost_model.md, "Sub-microbatches that fit").

A rank's memory in the simulator depends only on its own action order (a forward allocates its kept
activations at its start, ``B``/``W`` frees them at its end, a recomputing ``B``/``I`` adds its
transient while it runs), so it is replayed here without timing: ``backward_rooms`` gives, for every
encoder backward, the bytes left for its recomputation transient = budget - model state - activations
held when it starts. Kept activations are additive over samples, so cutting a sub changes what is held
at no other backward; only the transient of a recomputing backward (one layer's full activations of
the whole sub) shrinks with the sub. A cut sub's pieces run back to back where it ran (its forwards
in its forward unit, its backwards in its backward slot, the first piece's backward freeing its
activations before the next piece recomputes), and the pieces of a deferred sub stay deferred: they
are consumed by the same LLM microbatch ``mb + 1`` (routing is by sample id).

``split_to_fit`` cuts only subs that overflow, into the fewest contiguous pieces that fit on every
encoder stage (balanced by ViT patches when a balanced cut of that count fits too). A sample that
does not fit alone stays a piece of its own: the simulator then reports the overflow. A stage whose
held activations alone exceed its room is left to the memory check (more recomputation): no cut
helps there. Each extra
piece is an extra call, priced by the cost model (per-call constant, ``small_call_factor``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.plan import Action, ActionKind, MicrobatchSpec
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.schedules.common import balanced_pieces

__all__ = ["rank_rooms", "backward_rooms", "split_to_fit"]

Label = tuple[int, int]
"""Encoder (mb, sub)."""


def rank_rooms(costs: PlanCosts, budget_bytes: float) -> list[float]:
    """Per pipeline rank, activation bytes it may hold: ``budget_bytes`` minus its model state."""
    return [budget_bytes - costs.model_state_bytes(r) for r in range(costs.layout.ranks_per_replica)]


def backward_rooms(
    graph: ReplicaGraph, costs: PlanCosts, compute: dict[int, Sequence[Action]], rooms: Sequence[float]
) -> dict[tuple[int, int, int], float]:
    """(encoder stage, mb, sub) -> bytes its recomputing backward (``B`` or ``I``) may add on top of
    what its rank holds when it starts (negative: the rank is over its room already)."""
    out: dict[tuple[int, int, int], float] = {}
    for rank, actions in compute.items():
        held = 0.0
        for a in actions:
            ids = graph.ids(a.stage, a.mb, a.sub_index)
            if a.kind is ActionKind.F:
                held += costs.activation_bytes(a.stage, ids)
            elif a.kind in (ActionKind.B, ActionKind.I) and graph.is_encoder(a.stage):
                out[(a.stage, a.mb, a.sub_index)] = rooms[rank] - held
            if a.kind in (ActionKind.B, ActionKind.W):
                held -= costs.activation_bytes(a.stage, ids)
    return out


def _cut(ids: tuple[str, ...], fits, weights: Sequence[float]) -> tuple[tuple[str, ...], ...]:
    """Fewest contiguous runs of ``ids`` that each ``fits`` (a sample that does not fit alone is a run
    of its own); the work-balanced cut into as many runs instead when all of its runs fit."""
    runs: list[list[str]] = []
    for sid in ids:
        if runs and fits((*runs[-1], sid)):
            runs[-1].append(sid)
        else:
            runs.append([sid])
    greedy = tuple(tuple(r) for r in runs)
    balanced = balanced_pieces(ids, weights, len(greedy))
    if len(balanced) == len(greedy) and all(fits(r) for r in balanced):
        return balanced
    return greedy


def split_to_fit(
    graph: ReplicaGraph, costs: PlanCosts, compute: dict[int, Sequence[Action]], rooms: Sequence[float]
) -> tuple[tuple[MicrobatchSpec, ...], list[list[int]]]:
    """(microbatch specs with every overflowing encoder sub cut, ``[mb, subs before, subs after]`` per
    microbatch cut); the specs are ``graph.microbatches`` when nothing overflows."""
    room = backward_rooms(graph, costs, compute, rooms)
    stages = range(graph.num_encoder_stages)
    out, cuts = [], []
    for spec in graph.microbatches:
        subs: list[tuple[str, ...]] = []
        for u, ids in enumerate(spec.encoder_subs):
            # a stage whose held activations alone overflow gains nothing from a cut (recomputation must)
            avail = [(s, room[(s, spec.mb, u)]) for s in stages if room.get((s, spec.mb, u), -1.0) >= 0.0]

            def fits(piece, avail=avail):
                return all(costs.recompute_transient_bytes(s, piece) <= r for s, r in avail)

            if len(ids) < 2 or fits(ids):
                subs.append(ids)
            else:
                subs += _cut(ids, fits, [costs.tokens(0, (sid,)) for sid in ids])
        if len(subs) != len(spec.encoder_subs):
            cuts.append([spec.mb, len(spec.encoder_subs), len(subs)])
            spec = replace(spec, encoder_subs=tuple(subs))
        out.append(spec)
    return (tuple(out) if cuts else graph.microbatches), cuts
