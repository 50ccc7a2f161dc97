"""Entrain's memory split: an encoder (sub-)microbatch whose recomputing
backward would overflow its rank is cut into sub-microbatches that fit; the simulator sees the lower
peak, a plan that overflowed now fits, and no encoder sub exceeds its rank's budget unless it is a
single sample."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.plan import Action, ActionKind
from entrain.core.ir.validate import validate_plan
from entrain.core.planning.setups import SystemSetup
from entrain.core.schedules import entrain
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.schedules.memory_split import backward_rooms, rank_rooms
from entrain.sim.executor import simulate_plan
from entrain.sim.memory_fit import fit_memory, no_fit_message

from .fixtures import (
    deferral_assignment,
    disjoint_layout,
    draw_grouped_work,
    one_iteration,
    raw_samples,
    toy_cost,
)


def vit_like(cost):
    """Encoder layer 0 (patch embedding) keeps 1 B/token, the blocks 100 (full recomputation keeps
    their 1 B/token inputs and re-creates 99 B/token per block while it runs)."""
    layers = [replace(x, activation_bytes_per_token=100.0) for x in cost.encoder.layers]
    layers[0] = replace(layers[0], activation_bytes_per_token=1.0)
    return replace(cost, encoder=replace(cost.encoder, layers=tuple(layers)))


COST = vit_like(toy_cost(out_bytes_per_token=1.0))
WORK = {f"s{i}": (w, 3.0) for i, w in enumerate([10, 12, 8, 30, 5, 6, 7, 9])}
GROUPS = [["s0", "s1", "s2", "s3"], ["s4", "s5", "s6", "s7"]]


def _layout(recompute: str = "full", enc_pp: int = 2, k: int = 2, shared: bool = False):
    """``enc_pp`` encoder stages recomputing, one LLM stage on the next rank (``shared``: on the last
    encoder stage's rank, boundary sharing)."""
    base = disjoint_layout(enc_pp, 1, k=k, microbatch_size=4)
    stages = tuple(
        replace(s, recompute=recompute) if s.component == "encoder" else replace(s, pp_rank=enc_pp - shared)
        for s in base.stages
    )
    return replace(base, stages=stages)


def _plan(options: dict, layout=None, cost=COST, groups=GROUPS, works=WORK, deferred=None):
    assignment = deferral_assignment(groups, {"s3": (0, 1)} if deferred is None else deferred)
    plan = entrain.generate(layout or _layout(), one_iteration(assignment), raw_samples(works), cost, options)
    validate_plan(plan)
    return plan


def _compute(plan) -> dict[int, list[Action]]:
    return {r: [a for a in acts if a.kind.is_compute] for r, acts in plan.iterations[0].actions.items()}


def test_overflowing_subs_are_cut_in_place_and_deferred_pieces_stay_deferred():
    """Budget 150 B per rank: the non-deferred sub 0.0 of microbatch 0 is cut into singles (each
    recomputes alone), the deferred s3 stays last (consumed by LLM microbatch 1), microbatch 1 in two."""
    plan = _plan({"memory_budget_bytes": 150.0})
    mbs = plan.iterations[0].microbatches[0]
    assert [m.encoder_subs for m in mbs] == [
        (("s0",), ("s1",), ("s2",), ("s3",)),
        (("s4", "s5"), ("s6", "s7")),
    ]
    assert "s3" in mbs[1].llm_ids and "s3" not in mbs[0].llm_ids
    assert plan.options["memory_split"] == {
        "room_bytes": [150.0, 150.0, 150.0],
        "cuts": [[[[0, 2, 4], [1, 1, 2]]]],
    }
    rank0 = " ".join(str(a) for a in _compute(plan)[0])
    assert rank0 == "0F0.0 0F0.1 0F0.2 0F0.3 0F1.0 0F1.1 0B0.0 0B0.1 0B0.2 0B0.3 0B1.0 0B1.1"
    # the deferred piece's gradients come with LLM microbatch 1: its backward waits for that slot
    graph = ReplicaGraph(plan.layout, mbs)
    assert graph.grad_slot(0, 3) == 1 and graph.grad_slot(0, 2) == 0


def test_no_split_when_every_sub_fits_or_when_no_cut_can_help():
    plan = _plan({})  # toy device memory (48 GB) holds everything
    assert "memory_split" not in plan.options
    assert plan.iterations[0].microbatches[0][0].encoder_subs == (("s0", "s1", "s2"), ("s3",))
    off = _plan({"memory_budget_bytes": 150.0, "memory_split": False})
    assert "memory_split" not in off.options
    assert off.iterations[0].microbatches == plan.iterations[0].microbatches
    # 1 B: what the ranks hold before any backward is over already; a cut would only add calls
    held_over = _plan({"memory_budget_bytes": 1.0})
    assert "memory_split" not in held_over.options
    assert held_over.iterations[0].microbatches == plan.iterations[0].microbatches


def test_simulated_peak_drops_and_pieces_cost_calls():
    call_cost = vit_like(toy_cost(out_bytes_per_token=1.0, call_ms=1.0))
    whole = _plan({"memory_budget_bytes": 200.0, "memory_split": False}, cost=call_cost)
    cut = _plan({"memory_budget_bytes": 200.0}, cost=call_cost)
    a, b = (simulate_plan(p, call_cost)[0] for p in (whole, cut))
    assert b.replicas[0].peak_bytes[0] < a.replicas[0].peak_bytes[0]
    busy = lambda run: sum(run.replicas[0].busy_ms[g] for g in (0, 1))  # noqa: E731
    assert busy(b) > busy(a)  # every extra piece pays the per-call constants


def test_fit_memory_finds_a_fitting_plan_only_with_the_split():
    """Device memory 300 B, one encoder stage: recomputation alone (full) leaves it at 378 B; with the
    split (and the same recomputation) it fits."""
    cost = replace(COST, hardware=replace(COST.hardware, device_memory_bytes=300.0))
    batches = [list(raw_samples(WORK).values())]
    layout = _layout("none", enc_pp=1)
    results = {}
    for split in (False, True):
        options = {"memory_split": split}
        setup = SystemSetup(layout, options, "test")
        results[split] = fit_memory("entrain", setup, batches, cost, options)
    (_, no), (fitted, yes) = results[False], results[True]
    assert no.metrics.fits_memory is False
    assert yes.metrics.fits_memory is True
    assert fitted.layout.stages[0].recompute == "full"
    assert "memory_split" in yes.plan.options


def test_no_fit_error_says_the_microbatches_were_cut():
    """200 B: even s3 alone overflows after full recomputation and the split; the one-line error keeps
    naming the fullest rank and says the encoder microbatches were already cut."""
    cost = replace(COST, hardware=replace(COST.hardware, device_memory_bytes=200.0))
    batches = [list(raw_samples(WORK).values())]
    options = {"memory_split": True}
    _, run = fit_memory(
        "entrain", SystemSetup(_layout("none", enc_pp=1), options, "test"), batches, cost, options
    )
    assert run.metrics.fits_memory is False
    msg = no_fit_message(run, batches, cost)
    assert "pipeline rank 0 (encoder, recompute full)" in msg
    assert msg.endswith("encoder microbatches already cut into sub-microbatches")


@given(st.data())
def test_no_encoder_sub_exceeds_its_budget_unless_single(data):
    """After assignment and splitting, every encoder backward's held activations + recomputation
    transient stay within its rank's room unless its sub is one sample (or what the rank holds already
    overflows); and when every single sample
    fits, the simulated peak of each encoder-only rank does too. Disjoint and boundary-sharing layouts,
    with and without split weight gradients and the fill/drain ramp."""
    groups, works, deferred = draw_grouped_work(data.draw, st, max_mbs=4, max_per_mb=5)
    enc_pp, shared = data.draw(st.integers(1, 2)), data.draw(st.booleans())
    budget = data.draw(st.floats(100.0, 700.0))
    mode = data.draw(st.sampled_from(["selective", "full"]))
    layout = _layout(mode, enc_pp=enc_pp, k=len(groups), shared=shared)
    options = {
        "memory_budget_bytes": budget,
        "split_weight_grads": data.draw(st.booleans()),
        "ramp_microbatches": data.draw(st.integers(0, 1)),
    }
    plan = _plan(options, layout, groups=groups, works=works, deferred=deferred)
    costs = PlanCosts(plan.layout, COST, plan.samples)
    graph = ReplicaGraph(plan.layout, plan.iterations[0].microbatches[0])
    rooms = rank_rooms(costs, budget)
    room_at = backward_rooms(graph, costs, _compute(plan), rooms)
    every_single_fits = True
    for (stage, mb, sub), room in room_at.items():
        ids = graph.ids(stage, mb, sub)
        every_single_fits &= all(costs.recompute_transient_bytes(stage, (s,)) <= room for s in ids)
        if len(ids) > 1 and room >= 0:  # held alone over the room: recomputation's job, not a cut's
            assert costs.recompute_transient_bytes(stage, ids) <= room, (stage, mb, sub, ids)
    if every_single_fits:
        peaks = simulate_plan(plan, COST)[0].replicas[0].peak_bytes
        for r in range(enc_pp - shared):
            assert peaks[r] <= rooms[r] * (1 + 1e-9), (r, peaks[r], rooms[r])


def test_backward_rooms_match_the_simulator():
    """The replay without timing gives the simulator's encoder-rank peaks (the split's premise)."""
    plan = _plan({"memory_budget_bytes": 200.0, "split_weight_grads": True})
    costs = PlanCosts(plan.layout, COST, plan.samples)
    graph = ReplicaGraph(plan.layout, plan.iterations[0].microbatches[0])
    room_at = backward_rooms(graph, costs, _compute(plan), [0.0] * 3)
    peaks = simulate_plan(plan, COST)[0].replicas[0].peak_bytes
    for r in (0, 1):
        replay = max(
            -room + costs.recompute_transient_bytes(s, graph.ids(s, m, u))
            for (s, m, u), room in room_at.items()
            if plan.layout.stages[s].pp_rank == r
        )
        assert abs(replay - peaks[r]) < 1e-9, (r, replay, peaks[r])
    assert ActionKind.I in {a.kind for acts in _compute(plan).values() for a in acts}
