"""Building blocks shared by the schedule generators.

* ``ScheduleOptions``: the generators' knobs (eager-forward budget, DIP sub-microbatch caps).
* Microbatch specs from a ``ReplicaAssignment``: one sub per microbatch (1F1B, DistTrain),
  Entrain's non-deferred / deferred encoder subs.
* ``one_f_one_b_order``: the 1F1B pattern over *units* (a forward unit = the forwards of one
  microbatch's subs, a backward slot = the backwards whose gradients the slot's LLM microbatch
  supplies), with a configurable warm-up count.
* ``build_plan``: runs a per-replica compute-order function over every iteration, lowers to
  SEND/RECV (``lowering.add_comms``) and assembles the ``Plan``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from entrain.core.assignment.types import IterationAssignment, ReplicaAssignment
from entrain.core.errors import ConfigError
from entrain.core.plan import Action, ActionKind, IterationPlan, Layout, MicrobatchSpec, Plan
from entrain.core.schedules.graph import ReplicaGraph
from entrain.core.schedules.lowering import add_comms
from entrain.core.work import SampleWork

__all__ = [
    "ScheduleOptions",
    "plain_specs",
    "entrain_specs",
    "one_f_one_b_order",
    "stage_units",
    "build_plan",
    "require_one_stage_per_rank",
]

ComputeOrder = Callable[[ReplicaGraph], dict[int, list[Action]]]


@dataclass(frozen=True, slots=True)
class ScheduleOptions:
    """Generator options. Units: bytes factor (dimensionless), ViT patches, LLM tokens."""

    eager_budget_factor: float = 1.25
    """Entrain's eager-forward budget per rank = factor x (peak activation bytes of its plain 1F1B
    schedule: the warm-up plus the deferred sub-microbatches it must hold)."""
    dip_encoder_cap_patches: float | None = None
    """DIP: at most this many ViT patches per encoder sub-microbatch (None: 2x the profile's mean)."""
    dip_llm_cap_tokens: float | None = None
    """DIP: at most this many LLM tokens per LLM sub-microbatch (None: 2x the profile's mean)."""
    dip_profile_samples: int = 4
    """DIP's profile (one microbatch): the first this-many samples of the first iteration."""
    ramp_microbatches: int = 0
    """Entrain extension (off by default; not in the paper): cut the first and the last this-many
    microbatches (encoder non-deferred part and LLM microbatch) into ``ramp_pieces`` work-balanced
    sub-microbatches, so the pipeline fills and drains at a finer grain."""
    ramp_pieces: int = 2

    @classmethod
    def from_any(cls, options: ScheduleOptions | dict | None) -> ScheduleOptions:
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        known = set(cls.__dataclass_fields__)
        unknown = set(options) - known
        if unknown:
            raise ConfigError(f"unknown schedule option(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**options)

    def to_json(self) -> dict:
        return asdict(self)


# --- microbatch specs ------------------------------------------------------------------------------
def plain_specs(rep: ReplicaAssignment) -> tuple[MicrobatchSpec, ...]:
    """One sub per microbatch, in execution order."""
    return tuple(
        MicrobatchSpec(pos, i, (rep.encoder_microbatches[i],), (rep.llm_microbatches[i],))
        for pos, i in enumerate(rep.execution_order)
    )


def entrain_specs(
    rep: ReplicaAssignment, samples: dict[str, SampleWork] | None = None, ramp: int = 0, pieces: int = 2
) -> tuple[MicrobatchSpec, ...]:
    """Entrain: an encoder microbatch with deferrals runs as sub 0 (non-deferred samples) and
    sub 1 (deferred samples, consumed by the next LLM microbatch); LLM microbatches whole.

    With ``ramp > 0`` (an extension, see ``ScheduleOptions.ramp_microbatches``) the first and last
    ``ramp`` microbatches cut their non-deferred encoder part and their LLM microbatch into
    ``pieces`` work-balanced subs (the deferred encoder sub, if any, stays last)."""
    out = []
    k = len(rep.execution_order)
    for pos, i in enumerate(rep.execution_order):
        ids = rep.encoder_microbatches[i]
        deferred = set(rep.deferred_from(i))
        kept = tuple(s for s in ids if s not in deferred)
        moved = tuple(s for s in ids if s in deferred)
        llm_subs: tuple[tuple[str, ...], ...] = (rep.llm_microbatches[i],)
        enc_kept: tuple[tuple[str, ...], ...] = (kept,) if kept else ()
        if samples is not None and ramp > 0 and (pos < ramp or pos >= k - ramp):
            enc_kept = balanced_pieces(kept, [samples[s].encoder for s in kept], pieces)
            llm_subs = balanced_pieces(llm_subs[0], [samples[s].llm for s in llm_subs[0]], pieces)
        subs = enc_kept + ((moved,) if moved else ()) or ((),)
        out.append(MicrobatchSpec(pos, i, subs, llm_subs))
    return tuple(out)


def balanced_pieces(ids: Sequence[str], work: Sequence[float], pieces: int) -> tuple[tuple[str, ...], ...]:
    """Cut ``ids`` in order into at most ``pieces`` non-empty runs of about equal ``work``."""
    if len(ids) < 2 or pieces < 2:
        return (tuple(ids),) if ids else ()
    total = float(sum(work))
    out: list[list[str]] = [[]]
    acc = 0.0
    for sid, w in zip(ids, work):
        target = total * len(out) / pieces
        if out[-1] and len(out) < pieces and abs(acc + w - target) > abs(acc - target):
            out.append([])
        out[-1].append(sid)
        acc += w
    return tuple(tuple(g) for g in out)


# --- 1F1B over units -------------------------------------------------------------------------------
def _sub(graph: ReplicaGraph, stage: int, mb: int, sub: int) -> int | None:
    return None if graph.num_subs(stage, mb) == 1 else sub


def stage_units(graph: ReplicaGraph, stage: int) -> tuple[list[list[Action]], list[list[Action]]]:
    """(forward units, backward slots) of one stage, both indexed by microbatch position.

    A backward slot k holds the backwards of the tasks whose gradients LLM microbatch k supplies
    (``ReplicaGraph.grad_slot``): Entrain's split backward runs a deferred encoder sub in the slot
    of the LLM microbatch that consumed it."""
    k = len(graph.microbatches)
    fwd: list[list[Action]] = [[] for _ in range(k)]
    bwd: list[list[Action]] = [[] for _ in range(k)]
    for _, m, u in graph.tasks(stage):
        s = _sub(graph, stage, m, u)
        fwd[m].append(Action(stage, ActionKind.F, m, s))
        slot = graph.grad_slot(m, u) if graph.is_encoder(stage) else m
        bwd[slot].append(Action(stage, ActionKind.B, m, s))
    return fwd, bwd


def one_f_one_b_order(fwd: Sequence[list[Action]], bwd: Sequence[list[Action]], warmup: int) -> list[Action]:
    """Warm-up forwards, then (forward unit, backward slot) pairs, then the remaining slots."""
    n = len(fwd)
    w = max(0, min(warmup, n))
    out = [a for unit in fwd[:w] for a in unit]
    for i in range(n - w):
        out += fwd[w + i]
        out += bwd[i]
    for i in range(n - w, n):
        out += bwd[i]
    return out


def require_one_stage_per_rank(layout: Layout, system: str) -> None:
    per_rank = [len(layout.stages_of(r)) for r in range(layout.ranks_per_replica)]
    if any(n != 1 for n in per_rank):
        raise ConfigError(
            f"{system} needs one stage per pipeline rank; the layout has {per_rank} stages per rank"
        )


# --- plan assembly ---------------------------------------------------------------------------------
def build_plan(
    system: str,
    layout: Layout,
    assignments: Sequence[IterationAssignment],
    samples: dict[str, SampleWork],
    specs: Callable[[ReplicaAssignment], tuple[MicrobatchSpec, ...]],
    order: ComputeOrder,
    options: dict,
) -> Plan:
    """Assemble a Plan: per iteration and replica, microbatch specs, compute order, lowering."""
    iterations = []
    for ia in assignments:
        if len(ia.replicas) != layout.dp:
            raise ConfigError(f"assignment has {len(ia.replicas)} replicas but the layout has dp={layout.dp}")
        all_specs, actions = [], {}
        for r, rep in enumerate(ia.replicas):
            mbs = specs(rep)
            graph = ReplicaGraph(layout, mbs)
            lowered = add_comms(graph, order(graph))
            for pp, acts in lowered.items():
                actions[layout.global_rank(r, pp)] = tuple(acts)
            all_specs.append(mbs)
        iterations.append(IterationPlan(ia, tuple(all_specs), actions))
    used = {s for ia in assignments for rep in ia.replicas for s in rep.sample_ids}
    missing = sorted(used - set(samples))
    if missing:
        raise ConfigError(f"{len(missing)} assigned sample(s) have no work, e.g. {missing[0]!r}")
    return Plan(system, layout, tuple(iterations), {s: samples[s] for s in sorted(used)}, dict(options))
