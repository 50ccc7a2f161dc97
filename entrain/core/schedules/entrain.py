"""``entrain``: Entrain's pipeline schedule (paper §5.3, docs/design.md §1.3).

* Pairwise order: microbatches run in the assignment's ``execution_order`` (ol0, ul0, ol1, ...).
* An encoder microbatch with deferrals runs two forwards back to back in its slot: sub 0 (its
  non-deferred samples), then sub 1 (the deferred ones), each its own call (per-call constant) and
  its own activation message; sub 1 is consumed by the next LLM microbatch.
* Split backward: every encoder stage runs the backward of sub 0 in its own microbatch's slot and
  that of sub 1 in the slot of the partner LLM microbatch that consumed it, when its gradients
  arrive (``common.stage_units``).
* Eager forward: stage ``s`` warms up with as many forwards as fit its activation budget
  ``eager_budget_factor x`` (peak activation bytes of its plain 1F1B order: the warm-up plus the
  deferred sub-microbatches it holds), at least the plain ``p - s - 1``; warm-ups are then made
  non-increasing along the pipeline (stage ``s+1`` never warms up more than stage ``s``), which
  keeps the order deadlock-free. The budget per rank is recorded in ``Plan.options``.

Extensions (ours, not the paper's; each can be switched off to get the paper's schedule):

* Ramped fill/drain (``ScheduleOptions.ramp_microbatches``): the first and last ``p - 1``
  microbatches run their non-deferred encoder part and their LLM microbatch as 2 work-balanced
  sub-microbatches, so the pipeline fills and drains at half the grain (balanced microbatches
  otherwise pay the full ``(p - 1)`` fill/drain, which DistTrain's reorder and DIP's
  sub-microbatches shorten). ``"auto"`` keeps, per replica, whichever of the plain order and the
  orders ramped over ``p - 1`` microbatches in 2 .. min(microbatch size, 8) pieces has the lowest
  predicted makespan (``predict.predicted_makespan_ms``: the cost model's compute and p2p times, the
  simulator's rules; ties to the earlier candidate); the choices ``[ramp, pieces]`` are recorded in
  ``Plan.options["ramp_chosen"][iteration][replica]``. Gradients are unchanged by construction (the loss is
  normalised by the global label count; tested against the single-process reference).
* Pair order (``ScheduleOptions.pair_order``): ``"auto"`` keeps, per replica, Algorithm 3's order of
  the deferral pairs or the pairs light first or heavy first (``pairs.ordered_pairs``), whichever has
  the lowest predicted makespan with the replica's chosen assignment and ramp; recorded in
  ``Plan.options["pair_order_chosen"][iteration][replica]``. Not under ``ep > 1``, whose groups align
  their pairs instead (below).
* Split weight gradients (``ScheduleOptions.split_weight_grads``): each ``B`` of the order becomes
  ``I`` and ``W``; the gradient leaves after ``I``, so fill/drain and every wait on a downstream
  gradient shrink by the weight-gradient half of a backward. Same work per rank, same order of
  backwards. On a fused rank (boundary sharing, below) a backward slot holds several ``B``s, run in
  the order ``ScheduleOptions.backward_order`` says (``split_weight_grads``): ``"slot"``, the slot's
  ``I``s then its ``W``s (the encoder's gradient does not wait for the LLM's ``W``), or ``"per-b"``,
  each ``B`` as ``I, W`` in place; identical on every other rank. It is decided per plan by
  simulation (``entrain.core.planning.setups``, the ``backward_order`` decision), not per iteration by
  ``predicted_makespan_ms``: the slot order only moves ``I``s earlier and ``W``s later, so its
  prediction is never above per-b's; per-b can only win through the fused rank's memory (``W``
  frees the activations), which only the simulated memory check prices. Recorded in
  ``Plan.options["backward_order"]`` where a rank is fused.
* Boundary sharing (the layout, ``planning.boundary.boundary_sharing_config``): a pipeline rank may hold
  several consecutive stages — the last encoder stage and the first LLM stage. Such a rank runs
  them as one fused stage (``common.rank_units``): forward unit k = its encoder sub-forwards of
  microbatch k, then the LLM forward of k (fed locally, deferred samples included); backward slot k
  = the LLM backward of k, then the encoder backwards whose gradients it completes. Warm-up and
  eager forward are per rank; deferral is unchanged.
* Expert parallelism (``ep > 1`` on the LLM): the replicas of an EP group run one LLM program (their
  sparse layers' all-to-alls pair up by position): one microbatch count, the one whose slowest replica
  is predicted fastest from the group's least ``K_eff`` to its largest (``as_assigned``,
  ``assignment.hierarchical.same_count_per_ep_group``), one ramp, and on LLM ranks the least eager
  warm-up (``best_of_group``); each replica runs its deferral pairs in the slots of the group's
  reference replica's pairs of the same LLM weight rank, so the heavy ones meet (``_aligned``);
  encoder microbatches, deferrals and memory-split cuts stay per replica.
  ``ep`` 1: unchanged.
* Memory split (``ScheduleOptions.memory_split``, ``memory_split.split_to_fit``): an encoder sub
  whose recomputing backward would take its rank over the memory budget (device memory by default)
  is cut into sub-microbatches that fit, run back to back in its place (a deferred sub's pieces stay
  deferred); only where needed, priced as extra calls, recorded in ``Plan.options["memory_split"]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from entrain.core.assignment.hierarchical import assign_replica, replica_assignment, same_count_per_ep_group
from entrain.core.assignment.stratified import microbatch_count, stratified_assign
from entrain.core.assignment.two_resource import (
    EQUAL_SHARES,
    assign_replica_two_resource,
    replica_loads,
    split_dp_two_resource,
)
from entrain.core.costs.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.microbatches import IterationAssignment, ReplicaAssignment
from entrain.core.ir.plan import Action, ActionKind, Layout, Plan
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.schedules.common import (
    ScheduleOptions,
    build_plan_per_replica,
    check_replicas,
    entrain_specs,
    has_fused_rank,
    one_f_one_b_order,
    rank_units,
    require_stage_chain,
)
from entrain.core.schedules.expert_works import (
    ep_group_bins,
    expert_works,
    priced,
    rank_shares,
    weighed,
)
from entrain.core.schedules.lowering import add_comms
from entrain.core.schedules.memory_split import rank_rooms, split_to_fit
from entrain.core.schedules.pairs import (
    PAIR_ORDER_CANDIDATES,
    aligned_pairs,
    heaviest_pairs_first,
    ordered_pairs,
    pair_ranks,
)
from entrain.core.schedules.predict import predicted_makespan_ms
from entrain.core.workers import ordered_map
from entrain.core.workload.work import SampleWork

__all__ = [
    "generate",
    "eager_warmups",
    "peak_bytes",
    "rank_shares",
    "split_weight_grads",
    "heaviest_pairs_first",
    "expert_works",
    "ep_group_bins",
]

NAME = "entrain"


def peak_bytes(fwd_bytes: Sequence[float], bwd_bytes: Sequence[float], warmup: int) -> float:
    """Peak activation bytes of the 1F1B unit order with ``warmup`` forwards (forward unit k
    allocates ``fwd_bytes[k]``, backward slot k frees ``bwd_bytes[k]``)."""
    n = len(fwd_bytes)
    w = max(0, min(warmup, n))
    mem = peak = float(sum(fwd_bytes[:w]))
    for i in range(n - w):
        mem += fwd_bytes[w + i]
        peak = max(peak, mem)
        mem -= bwd_bytes[i]
    return peak


def eager_warmups(
    graph: ReplicaGraph, costs: PlanCosts, factor: float, units: list | None = None
) -> tuple[list[int], list[float]]:
    """(warm-up forwards per pipeline rank, budget bytes per rank) for eager forward; ``units``:
    ``rank_units`` of every rank when already computed."""
    p = graph.layout.ranks_per_replica
    units = units or [rank_units(graph, r) for r in range(p)]
    warm: list[int] = []
    budgets: list[float] = []
    for rank in range(p):
        fwd, bwd = units[rank]
        fb = [
            sum(costs.activation_bytes(a.stage, graph.ids(a.stage, a.mb, a.sub_index)) for a in unit)
            for unit in fwd
        ]
        bb = [
            sum(costs.activation_bytes(a.stage, graph.ids(a.stage, a.mb, a.sub_index)) for a in slot)
            for slot in bwd
        ]
        plain = p - rank - 1
        budget = factor * peak_bytes(fb, bb, plain)
        w = plain
        if budget > 0:
            while w < len(fwd) and peak_bytes(fb, bb, w + 1) <= budget:
                w += 1
        if rank > 0:
            w = min(w, warm[-1])
        warm.append(max(w, min(plain, len(fwd))))
        budgets.append(budget)
    return warm, budgets


MAX_AUTO_PIECES = 8


def _ramp_candidates(opts: ScheduleOptions, layout: Layout, rep) -> list[tuple[int, int]]:
    """(ramp microbatches, pieces) to try: the option itself, or for ``"auto"`` no ramp, then the
    first and last ``p - 1`` microbatches cut into 2 .. min(largest microbatch, 8) pieces."""
    if opts.ramp_microbatches != "auto":
        return [(int(opts.ramp_microbatches), opts.ramp_pieces)]
    largest = max((len(m) for m in rep.llm_microbatches), default=1)
    ramp = layout.ranks_per_replica - 1
    out = [(0, opts.ramp_pieces)]
    if ramp > 0:
        out += [(ramp, q) for q in range(2, min(largest, MAX_AUTO_PIECES) + 1)]
    return out


def split_weight_grads(actions: Sequence[Action], per_slot: bool = True) -> list[Action]:
    """Every ``B`` replaced by ``I`` and ``W`` of the same (stage, microbatch, sub): the ``I``s of a
    backward slot (consecutive ``B``s of decreasing stages: a fused rank's LLM backward, then the
    encoder backwards it completes) first, then their ``W``s, so the gradient the slot sends
    upstream does not wait for the slot's weight gradients (a rank of one stage: ``I`` then ``W``).
    ``per_slot`` False (``ScheduleOptions.backward_order`` ``"per-b"``): each ``B`` as ``I, W`` in place."""
    out: list[Action] = []
    slot: list[Action] = []

    def flush() -> None:
        out.extend(Action(b.stage, ActionKind.I, b.mb, b.sub) for b in slot)
        out.extend(Action(b.stage, ActionKind.W, b.mb, b.sub) for b in slot)
        slot.clear()

    for a in actions:
        if a.kind is not ActionKind.B:
            flush()
            out.append(a)
            continue
        if slot and (not per_slot or a.stage >= slot[0].stage):
            flush()  # a later slot (drain: the same stages again)
        slot.append(a)
    flush()
    return out


def _warmups(
    graph: ReplicaGraph, costs: PlanCosts | None, factor: float, eager: bool, units=None
) -> list[int]:
    """Warm-up forwards per pipeline rank: eager forward's, or the plain ``p - r - 1``."""
    p = graph.layout.ranks_per_replica
    return eager_warmups(graph, costs, factor, units)[0] if eager else [p - r - 1 for r in range(p)]


def _compute_order(costs: PlanCosts | None, factor: float, eager: bool, split: str | None = None):
    """Per-rank compute orders of a graph; ``split``: the ``backward_order`` of split backwards;
    ``warm``: the warm-up forwards per rank where given (else ``_warmups``)."""

    def order(graph: ReplicaGraph, warm: list[int] | None = None) -> dict[int, list[Action]]:
        p = graph.layout.ranks_per_replica
        units = [rank_units(graph, r) for r in range(p)]
        warm = _warmups(graph, costs, factor, eager, units) if warm is None else warm
        out = {}
        for rank in range(p):
            fwd, bwd = units[rank]
            out[rank] = one_f_one_b_order(fwd, bwd, warm[rank])
            if split:
                out[rank] = split_weight_grads(out[rank], per_slot=split == "slot")
        return out

    return order


def _assignment_candidates(
    opts: ScheduleOptions,
    costs: PlanCosts | None,
    rep: ReplicaAssignment,
    samples: dict[str, SampleWork],
    num_microbatches: int,
) -> list[tuple[str, ReplicaAssignment]]:
    """(name, replica assignment) to try: the given one (the paper's, from ``assign_entrain``) and/or
    the two-resource one (skipped under ``auto`` when it is the same). Under ``microbatch_count``
    ``"requested"`` both with the requested count (the given one assigned again where its ``K_eff``
    was below it)."""
    rule = opts.microbatch_count
    mine = [samples[s] for s in sorted(rep.sample_ids)]
    if rule != "paper" and rep.k_eff != microbatch_count([w.encoder for w in mine], num_microbatches, rule):
        rep = replica_assignment(stratified_assign(mine, num_microbatches, rule))
    out = [("paper", rep)] if opts.assignment in ("paper", "auto") else []
    if opts.assignment in ("two-resource", "auto"):
        ids = rep.sample_ids
        shares = rank_shares(costs, ids) if costs is not None else EQUAL_SHARES
        alt = assign_replica_two_resource(
            [samples[s] for s in sorted(ids)], num_microbatches, shares, paper=rep, rule=rule
        )
        if (
            not out
            or alt.llm_microbatches != rep.llm_microbatches
            or alt.encoder_microbatches != rep.encoder_microbatches
        ):
            out.append(("two-resource", alt))
    return out


DP_SPLIT_MIN_GAIN = 0.01
"""Entrain re-splits an iteration across replicas only where that lowers the largest per-rank replica
load by at least this fraction. A re-split reshuffles every replica's microbatches, so its schedule,
ramp and memory peaks (and with them the simulated memory check's recomputation) move by a fraction
of a percent either way. Measured when this was chosen (the zoo's setup: 64 GPUs, DP 4, TP 2, global
batch 512, microbatch size 4, a40-paper, 3 iterations, 1B and 3B): on docvqa, multi-image and video the
re-split lowers this load by under 0.3 % and, taken, moved multi-image 3B's simulated time +0.45 %
through the memory check; on text-heavy and long-context it lowers the load by 2-9 %."""


def balanced_dp_split(
    ia: IterationAssignment,
    samples: dict[str, SampleWork],
    costs: PlanCosts | None,
    num_microbatches: int,
    predict: Callable[[ReplicaAssignment], float] | None = None,
) -> tuple[str, IterationAssignment]:
    """("paper", ``ia``) or ("two-resource", the iteration re-split across replicas by
    ``split_dp_two_resource`` with the paper's assignment per replica): the latter where its largest
    per-rank replica load is at least ``DP_SPLIT_MIN_GAIN`` below the paper split's and, given
    ``predict`` (a replica's predicted makespan), its slowest replica is predicted faster too (the
    load ignores the pipeline: fill, drain, microbatch grain). Shares from ``costs`` (``rank_shares``;
    ``EQUAL_SHARES`` without a cost model)."""
    ids = sorted(s for rep in ia.replicas for s in rep.sample_ids)
    shares = rank_shares(costs, ids) if costs is not None else EQUAL_SHARES
    paper = [[samples[s] for s in rep.sample_ids] for rep in ia.replicas]
    alt = split_dp_two_resource([samples[s] for s in ids], len(ia.replicas), shares)

    def largest(reps) -> float:
        return float(replica_loads(reps, shares).max(initial=0.0))

    if not largest(alt) <= (1.0 - DP_SPLIT_MIN_GAIN) * largest(paper):
        return "paper", ia
    resplit = IterationAssignment(tuple(assign_replica(r, num_microbatches) for r in alt))
    if predict is not None and max(map(predict, resplit.replicas)) >= max(map(predict, ia.replicas)):
        return "paper", ia
    return "two-resource", resplit


class _ReplicaSearch:
    """Entrain's per-replica choices of one plan: each candidate (assignment, ramp) of a replica is
    lowered, split to fit memory and predicted; ``best_of`` keeps a replica's best, ``best_of_group``
    the best of an expert-parallel group's replicas, which must run one LLM program."""

    def __init__(
        self,
        layout: Layout,
        samples: dict[str, SampleWork],
        costs: PlanCosts | None,
        opts,
        eager: bool,
        balance: dict[str, SampleWork] | None = None,
    ):
        self.layout, self.samples, self.costs, self.opts, self.eager = layout, samples, costs, opts, eager
        self.balance = samples if balance is None else balance
        """The works the assignment weighs (``expert_works`` under ``expert_assignment``; else ``samples``)."""
        self.auto = opts.ramp_microbatches == "auto" or opts.assignment == "auto"
        split = opts.backward_order if opts.split_weight_grads else None
        self.order = _compute_order(costs, opts.eager_budget_factor, eager, split)
        self.rooms = _memory_rooms(opts, costs)

    def candidate(self, assigned: ReplicaAssignment, ramp: int, pieces: int, predict: bool | None = None):
        """(predicted ms or 0, graph, compute order, memory-split cuts) of one candidate."""
        predict = self.auto if predict is None else predict
        graph = ReplicaGraph(self.layout, entrain_specs(assigned, self.samples, ramp, pieces))
        compute = self.order(graph)
        cut: list[list[int]] = []
        if self.rooms is not None:
            mbs, cut = split_to_fit(graph, self.costs, compute, self.rooms)
            if cut:
                graph = ReplicaGraph(self.layout, mbs)
                compute = self.order(graph)
        return (predicted_makespan_ms(graph, self.costs, compute) if predict else 0.0), graph, compute, cut

    def candidates(self, rep: ReplicaAssignment) -> list[tuple[str, ReplicaAssignment]]:
        return _assignment_candidates(self.opts, self.costs, rep, self.balance, self.layout.num_microbatches)

    def unramped(self, rep: ReplicaAssignment) -> float:
        """A replica's predicted makespan: the assignment candidate best on its own objective (the
        two-resource one where it differs from the paper's), no ramp."""
        return self.candidate(self.candidates(rep)[-1][1], 0, self.opts.ramp_pieces, predict=True)[0]

    def as_assigned(self, rep: ReplicaAssignment) -> float:
        """A replica's predicted makespan on ``rep`` itself, no ramp (``same_count_per_ep_group``'s count)."""
        return self.candidate(rep, 0, self.opts.ramp_pieces, predict=True)[0]

    def best_of(self, rep: ReplicaAssignment) -> tuple:
        """([ramp, pieces], specs, lowered order, assignment name, assignment, cuts, pair order) of the
        best: each assignment candidate under each ramp candidate, then under ``pair_order`` ``"auto"``
        the best one's pairs in each of ``PAIR_ORDER_CANDIDATES`` (its ramp kept)."""
        fixed = self.opts.pair_order in PAIR_ORDER_CANDIDATES
        best, order = None, self.opts.pair_order if fixed else "paper"
        for name, assigned in self.candidates(rep):
            if fixed:
                assigned = ordered_pairs(assigned, self.opts.pair_order, self.microbatch_ms) or assigned
            for ramp, pieces in _ramp_candidates(self.opts, self.layout, assigned):
                t, graph, compute, cut = self.candidate(assigned, ramp, pieces)
                if best is None or t < best[0]:
                    best = (t, [ramp, pieces], graph, compute, name, assigned, cut, order)
        if self.opts.pair_order == "auto" and self.costs is not None:
            best = self._best_pair_order(best)
        return best[1], best[2].microbatches, add_comms(best[2], best[3]), *best[4:]

    def _best_pair_order(self, best: tuple) -> tuple:
        """``best`` or its assignment's pairs in another order (``ordered_pairs``), whichever has the
        lowest predicted makespan (ties: the earlier, Algorithm 3's first)."""
        (ramp, pieces), name, assigned = best[1], best[4], best[5]
        if not self.auto:  # the candidates above were not predicted
            best = (self.candidate(assigned, ramp, pieces, predict=True)[0], *best[1:])
        for order in PAIR_ORDER_CANDIDATES:
            alt = ordered_pairs(assigned, order, self.microbatch_ms)
            if alt is None or alt.execution_order == assigned.execution_order:
                continue
            t, graph, compute, cut = self.candidate(alt, ramp, pieces, predict=True)
            if t < best[0]:
                best = (t, [ramp, pieces], graph, compute, name, alt, cut, order)
        return best

    def microbatch_ms(self, rep: ReplicaAssignment, i: int) -> float:
        """Predicted forward + backward ms of ``rep``'s microbatch ``i``: its encoder microbatch on the
        encoder stages, its LLM microbatch on the LLM's (``ordered_pairs``' weight); without a cost
        model, the samples' encoder and LLM work."""
        if self.costs is None:
            return float(sum(self.samples[s].encoder for s in rep.encoder_microbatches[i])) + self.llm_ms(
                rep.llm_microbatches[i]
            )
        enc = sum(
            self.costs.compute_ms(spec.stage, kind, rep.encoder_microbatches[i])
            for spec in self.layout.stages
            if spec.component != "llm"
            for kind in (ActionKind.F, ActionKind.B)
        )
        return enc + self.llm_ms(rep.llm_microbatches[i])

    def best_of_group(self, reps: list[ReplicaAssignment]) -> list[tuple]:
        """``best_of`` for the replicas of one expert-parallel group, which must run one LLM program
        (their sparse layers' all-to-alls pair up, ``docs/design.md``): one ``K_eff`` (already, from
        ``same_count_per_ep_group``; assignment candidates with another are dropped, the paper's
        assignment where none is left), one ramp for the group (``_group_ramp``), and on every rank with
        LLM stages the group's least warm-up. Each replica keeps its own encoder microbatches,
        deferrals and memory-split cuts: encoder stages make no collectives."""
        k = reps[0].k_eff
        options = [
            [(n, a) for n, a in self.candidates(rep) if a.k_eff == k]
            or [("paper", rep)]  # the two-resource one alone, with another count: the paper's
            for rep in reps
        ]
        if self.opts.expert_balance:
            options = [[(n, heaviest_pairs_first(a, self.llm_ms)) for n, a in cands] for cands in options]
        else:
            options = self._aligned(options)
        chosen, picks = self._group_ramp(reps, options)
        warms = [_warmups(p[1], self.costs, self.opts.eager_budget_factor, self.eager) for p in picks]
        for r in {s.pp_rank for s in self.layout.stages if s.component == "llm"}:
            least = min(w[r] for w in warms)  # each replica's warm-ups stay non-increasing along the pipeline
            for w in warms:
                w[r] = least
        return [
            (chosen, p[1].microbatches, add_comms(p[1], self.order(p[1], w)), p[2], p[3], p[4], "paper")
            for p, w in zip(picks, warms)
        ]

    def _aligned(self, options: list[list[tuple]]) -> list[list[tuple]]:
        """Every candidate's deferral pairs moved to the slots of the group's reference replica's pairs
        of the same rank (``aligned_pairs``): the reference is the replica whose first candidate holds the
        group's heaviest LLM microbatch (ties: the lowest), and its own order is Algorithm 3's. The
        group's LLM stages run in lockstep, so its heavy microbatches then meet at one position instead
        of each holding the group at its own (``expert_balance`` moves them all to the front instead)."""
        firsts = [cands[0][1] for cands in options]
        heaviest = [max((self.llm_ms(m) for m in a.llm_microbatches), default=0.0) for a in firsts]
        ref = max(range(len(firsts)), key=lambda r: (heaviest[r], -r))
        slots = pair_ranks(firsts[ref], self.llm_ms)
        if slots is None:
            return options
        return [[(n, aligned_pairs(a, slots, self.llm_ms)) for n, a in cands] for cands in options]

    def _group_ramp(
        self, reps: list[ReplicaAssignment], options: list[list[tuple]]
    ) -> tuple[list[int], list]:
        """The group's ramp ([ramp, pieces]) and each replica's best candidate under it: the lowest
        predicted makespan of the slowest replica among the ramps that cut every replica's LLM
        microbatches into as many pieces (no ramp always does)."""
        largest = max(reps, key=lambda r: max((len(m) for m in r.llm_microbatches), default=1))
        ramps = _ramp_candidates(self.opts, self.layout, largest)
        ramps += [] if (0, self.opts.ramp_pieces) in ramps else [(0, self.opts.ramp_pieces)]
        best = None
        for ramp, pieces in ramps:
            picks = []
            for cands in options:
                pick = None
                for name, assigned in cands:
                    t, graph, _, cut = self.candidate(assigned, ramp, pieces)
                    if pick is None or t < pick[0]:
                        pick = (t, graph, name, assigned, cut)
                picks.append(pick)
            if len({tuple(len(m.llm_subs) for m in p[1].microbatches) for p in picks}) > 1:
                continue  # the LLM pieces differ: the replicas' LLM programs would too
            t = max(p[0] for p in picks)
            if best is None or t < best[0]:
                best = (t, [ramp, pieces], picks)
        return best[1], best[2]

    def llm_ms(self, ids: Sequence[str]) -> float:
        """Predicted forward + backward ms of ``ids`` over the LLM stages (expert work included)."""
        if self.costs is None:
            return float(sum(self.samples[s].llm for s in ids))
        return sum(
            self.costs.compute_ms(spec.stage, kind, ids)
            for spec in self.layout.stages
            if spec.component == "llm"
            for kind in (ActionKind.F, ActionKind.B)
        )

    def per_replica(self, assignments: Sequence[IterationAssignment]) -> list[tuple]:
        """``best_of`` of every replica of every iteration (``best_of_group`` per expert-parallel group
        of ep replicas, never across iterations: ep divides dp), in the replicas' order."""
        flat = [rep for ia in assignments for rep in ia.replicas]
        ep = max(c.ep for c in self.layout.components.values())
        if ep > 1:
            per_group = ordered_map(self.best_of_group, [flat[i : i + ep] for i in range(0, len(flat), ep)])
            return [p for group in per_group for p in group]
        return ordered_map(self.best_of, flat)


def generate(
    layout: Layout,
    assignments: Sequence[IterationAssignment],
    samples: dict[str, SampleWork],
    cost: CostModel | None = None,
    options: ScheduleOptions | None = None,
    system: str = NAME,
    eager: bool = True,
) -> Plan:
    require_stage_chain(layout, system)
    opts = ScheduleOptions.from_any(options)
    auto = opts.ramp_microbatches == "auto" or opts.assignment == "auto" or opts.pair_order == "auto"
    if (eager or auto) and cost is None:
        raise ConfigError(
            "entrain's eager forward, ramp='auto', assignment='auto' and pair_order='auto' need a cost model"
        )
    costs = PlanCosts(layout, cost, samples) if cost is not None else None
    plan_options = _plan_options(opts, layout, eager)
    ep = max(c.ep for c in layout.components.values())
    balance = samples  # the works the assignment weighs
    if opts.expert_assignment and ep > 1 and costs is not None:  # the busiest expert's time too
        balance = expert_works(costs, samples, assignments)
        assignments = [
            weighed(ia, balance, layout.num_microbatches, opts.microbatch_count) for ia in assignments
        ]
    search = _ReplicaSearch(layout, samples, costs, opts, eager, balance)
    splits: list[str] = []
    if opts.assignment != "paper" and opts.dp_resplit:  # the DP split too: the paper's or a two-resource one
        predict = search.unramped if costs is not None else None
        k = layout.num_microbatches
        picked = [balanced_dp_split(ia, balance, costs, k, predict) for ia in assignments]
        splits, assignments = [p[0] for p in picked], [p[1] for p in picked]
    if ep > 1:  # one LLM microbatch count per expert-parallel group
        group_predict = search.as_assigned if costs is not None else None
        assignments = [same_count_per_ep_group(ia, balance, ep, predict=group_predict) for ia in assignments]
        if balance is not samples and opts.expert_group_bins:  # the group's samples binned together
            assignments = [ep_group_bins(ia, balance, ep, costs) for ia in assignments]
    check_replicas(layout, assignments)
    picked_per_replica = search.per_replica(assignments)
    chosen = [p[0] for p in picked_per_replica]
    chosen_assignment, cuts = [p[3] for p in picked_per_replica], [p[5] for p in picked_per_replica]
    replica_results = iter(picked_per_replica)

    def replica(rep):
        _, mbs, compute, _, assigned, _, _ = next(replica_results)
        return mbs, compute, assigned if balance is samples else priced(assigned, samples)

    plan = build_plan_per_replica(system, layout, assignments, samples, replica, plan_options, lowered=True)
    per_iteration = [slice(i * layout.dp, (i + 1) * layout.dp) for i in range(len(assignments))]
    if opts.ramp_microbatches == "auto":
        plan.options["ramp_chosen"] = [chosen[s] for s in per_iteration]
    if opts.pair_order == "auto":
        orders = [p[6] for p in picked_per_replica]
        plan.options["pair_order_chosen"] = [orders[s] for s in per_iteration]
    if opts.assignment != "paper":
        plan.options["assignment_chosen"] = [chosen_assignment[s] for s in per_iteration]
        plan.options["dp_split_chosen"] = splits or ["paper"] * len(assignments)
    if any(cuts):
        plan.options["memory_split"] = {"room_bytes": search.rooms, "cuts": [cuts[s] for s in per_iteration]}
    return plan


def _plan_options(opts: ScheduleOptions, layout: Layout, eager: bool) -> dict:
    """The ``Plan.options`` the schedule options give (before the per-iteration choices)."""
    out: dict = {"eager_budget_factor": opts.eager_budget_factor} if eager else {}
    if opts.ramp_microbatches:
        out.update(ramp_microbatches=opts.ramp_microbatches, ramp_pieces=opts.ramp_pieces)
    if opts.split_weight_grads:
        out["split_weight_grads"] = True
        if has_fused_rank(layout):  # where the backward orders differ
            out["backward_order"] = opts.backward_order
    if opts.assignment != "paper":
        out["assignment"] = opts.assignment
    if opts.pair_order != "paper":
        out["pair_order"] = opts.pair_order
    if opts.expert_balance and max(c.ep for c in layout.components.values()) > 1:
        out["expert_balance"] = True
    if opts.expert_assignment and max(c.ep for c in layout.components.values()) > 1:
        out["expert_assignment"] = True
        if opts.expert_group_bins:
            out["expert_group_bins"] = True
    return out


def _memory_rooms(opts: ScheduleOptions, costs: PlanCosts | None) -> list[float] | None:
    """Per pipeline rank, the activation bytes the memory split keeps within (None: no split)."""
    if not opts.memory_split or costs is None:
        return None
    budget = opts.memory_budget_bytes
    return rank_rooms(costs, costs.cost.hardware.device_memory_bytes if budget is None else budget)
