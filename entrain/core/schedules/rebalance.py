"""Cross-replica encoder rebalancing of a generated Plan (Entrain's ``encoder_rebalance`` option,
``ScheduleOptions.encoder_rebalance``; the ``encoder-rebalance`` system does it in its batcher,
``assignment.batchers.rebalance``).

At every execution position ``p`` that all replicas have, the encoder's first sub-microbatch
``(p, 0)`` of each replica, when every sample of it feeds that replica's LLM microbatch ``p`` (not a
deferred sub), is rebalanced across the replicas (``assignment.batchers.rebalance.rebalance_encoder``: single
samples moved from the most to the least loaded replica while that lowers the pair's larger load,
each replica keeping one of its own samples). The tasks, their messages and so every rank's action
list stay as generated: only which samples an encoder sub holds changes, the LLM microbatches keep
their owners. A moved sample crosses replicas twice (its input out, its features back; gradients
in reverse): an all-to-all at each position, priced as the boundary message of the replica that
computed it (``assignment.batchers.rebalance``'s docstring: what the per-replica simulation does not see)."""

from __future__ import annotations

import math
from dataclasses import replace

from entrain.core.assignment.batchers.rebalance import rebalance_encoder
from entrain.core.ir.microbatches import IterationAssignment, ReplicaAssignment
from entrain.core.ir.plan import IterationPlan, MicrobatchSpec, Plan
from entrain.core.workload.work import SampleWork

__all__ = ["rebalance_plan", "rebalance_iteration"]


def _rebalanceable(specs: list[MicrobatchSpec]) -> bool:
    return all(
        s.encoder_subs and s.encoder_subs[0] and set(s.encoder_subs[0]) <= set(s.llm_ids) for s in specs
    )


def _with_sub0(spec: MicrobatchSpec, ids: tuple[str, ...]) -> MicrobatchSpec:
    return replace(spec, encoder_subs=(ids, *spec.encoder_subs[1:]))


def _assignment(rep: ReplicaAssignment, specs: tuple[MicrobatchSpec, ...], samples) -> ReplicaAssignment:
    enc = list(rep.encoder_microbatches)
    for spec in specs:
        enc[spec.encoder_index] = spec.encoder_ids
    work = tuple(math.fsum(samples[s].encoder for s in mb) for mb in enc)
    return replace(rep, encoder_microbatches=tuple(enc), encoder_work=work)


def _window_peak(loads: list[list[float]], window: int) -> float:
    """The largest sum of ``window`` consecutive positions' encoder work on any replica."""
    return max(
        (sum(row[i : i + window]) for row in loads for i in range(max(1, len(row) - window + 1))), default=0.0
    )


def rebalance_iteration(it: IterationPlan, samples: dict[str, SampleWork], window: int = 1) -> IterationPlan:
    """``it`` with its encoder sub-microbatches rebalanced across replicas (module docstring). A
    position's rebalancing is kept only where no replica's encoder work over any ``window``
    consecutive positions (the forwards a first encoder rank holds at once: its pipeline depth)
    exceeds the largest such sum of the plan as generated, so the memory it was fitted to holds."""
    reps = [list(r) for r in it.microbatches]
    if len(reps) < 2:
        return it

    def loads() -> list[list[float]]:
        return [[sum(samples[s].encoder for s in spec.encoder_ids) for spec in r] for r in reps]

    limit = _window_peak(loads(), window) * (1.0 + 1e-9)
    for p in range(min(len(r) for r in reps)):
        specs = [r[p] for r in reps]
        if not _rebalanceable(specs):
            continue
        enc = rebalance_encoder([[samples[s] for s in spec.encoder_subs[0]] for spec in specs])
        for r, group in enumerate(enc):
            reps[r][p] = _with_sub0(specs[r], tuple(s.id for s in group))
        if _window_peak(loads(), window) > limit:
            for r, spec in enumerate(specs):
                reps[r][p] = spec
    mbs = tuple(tuple(r) for r in reps)
    assignment = IterationAssignment(
        tuple(_assignment(rep, specs, samples) for rep, specs in zip(it.assignment.replicas, mbs))
    )
    return IterationPlan(assignment, mbs, it.actions)


def rebalance_plan(plan: Plan) -> Plan:
    """Every iteration of ``plan`` rebalanced (windows of the replica's pipeline depth);
    ``Plan.options["encoder_rebalance"]`` set."""
    depth = plan.layout.ranks_per_replica
    its = tuple(rebalance_iteration(it, plan.samples, depth) for it in plan.iterations)
    return replace(plan, iterations=its, options={**plan.options, "encoder_rebalance": True})
