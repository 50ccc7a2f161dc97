"""Entrain's extensions and memory realism in simulation: the predicted makespan the ``ramp="auto"``
choice uses equals the simulator's, ``auto`` never loses to either candidate, boundary-sharing
layouts (a rank holding the last encoder and the first LLM stage) are valid, deadlock-free and
accounted, and model state + activations are compared with device memory."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from entrain.core.errors import ConfigError
from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.plan import ActionKind, ComponentLayout, Layout, StageSpec
from entrain.core.ir.validate import validate_plan
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.schedules.common import PAIR_ORDERS
from entrain.core.schedules.entrain import split_weight_grads
from entrain.core.schedules.lowering import strip_comms
from entrain.core.schedules.predict import predicted_makespan_ms
from entrain.core.systems import generate_plan
from entrain.sim.executor import simulate_plan
from entrain.sim.metrics import compute_metrics
from tests.sim.fixtures import (
    deferral_assignment,
    disjoint_layout,
    draw_grouped_work,
    one_iteration,
    raw_samples,
    split,
    toy_cost,
)


def _chain_layout(
    enc_pp: int, llm_pp: int, shared: bool, *, dp: int = 1, k: int = 4, layers: int = 6
) -> Layout:
    """Encoder stages then LLM stages on consecutive ranks; ``shared``: the last encoder stage and the
    first LLM stage on one rank."""
    stages = []
    for i, (a, b) in enumerate(split(layers, enc_pp)):
        stages.append(StageSpec(i, "encoder", a, b, i))
    first_llm_rank = enc_pp - 1 if shared else enc_pp
    for j, (a, b) in enumerate(split(layers, llm_pp)):
        stages.append(StageSpec(enc_pp + j, "llm", a, b, first_llm_rank + j))
    comps = {"encoder": ComponentLayout(pp=enc_pp), "llm": ComponentLayout(pp=llm_pp)}
    return Layout(dp, 1, k, comps, tuple(stages))


@st.composite
def workloads(draw):
    groups, works, deferred = draw_grouped_work(draw, st, max_mbs=7, max_per_mb=4, min_mbs=2)
    enc_pp, llm_pp = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    shared = draw(st.booleans())
    latency = draw(st.sampled_from([0.0, 0.3]))
    ramp = draw(st.sampled_from([0, 1, 2, "auto"]))
    return groups, works, deferred, enc_pp, llm_pp, shared, latency, ramp


def _setup(w, system="entrain"):
    groups, works, deferred, enc_pp, llm_pp, shared, latency, ramp = w
    cost = toy_cost(enc_layers=6, llm_layers=6, call_ms=0.1, out_bytes_per_token=1e5, latency_ms=latency)
    layout = _chain_layout(enc_pp, llm_pp, shared, k=len(groups))
    samples = raw_samples(works)
    asg = one_iteration(deferral_assignment(groups, deferred))
    plan = generate_plan(system, layout, asg, samples, cost, {"ramp_microbatches": ramp})
    return cost, layout, samples, plan


@pytest.mark.parametrize("system", ["entrain", "entrain-1f1b"])
@given(w=workloads())
def test_chain_layouts_with_ramp_are_valid_and_predicted_exactly(system, w):
    cost, layout, samples, plan = _setup(w, system)
    validate_plan(plan)
    (run,) = simulate_plan(plan, cost)
    costs = PlanCosts(layout, cost, samples)
    it = plan.iterations[0]
    graph = ReplicaGraph(layout, it.microbatches[0])
    compute = {g: strip_comms(a) for g, a in it.actions.items()}
    rep = run.replicas[0]
    # the prediction ramp="auto" decides on is the simulator's compute-and-p2p makespan
    assert predicted_makespan_ms(graph, costs, compute) == pytest.approx(rep.makespan_ms)
    for g, busy in rep.busy_ms.items():
        expected = sum(
            costs.compute_ms(a.stage, a.kind, graph.ids(a.stage, a.mb, a.sub_index))
            for a in it.actions[g]
            if a.kind.is_compute
        )
        assert busy == pytest.approx(expected)
    m = compute_metrics(layout, [run], costs)
    assert m.iteration_time_ms >= m.lower_bound_ms * (1 - 1e-12)


@given(w=workloads())
def test_auto_ramp_never_loses_to_any_candidate(w):
    cost, layout, samples, auto = _setup((*w[:-1], "auto"))
    (rep,) = auto.iterations[0].assignment.replicas
    ramp = layout.ranks_per_replica - 1
    largest = max(len(m) for m in rep.llm_microbatches)
    candidates = [(0, 2)] + [(ramp, q) for q in range(2, min(largest, 8) + 1)] if ramp else [(0, 2)]
    times = []
    for r, q in candidates:
        plan = generate_plan("entrain", layout, one_iteration(rep), samples, cost,
                             {"ramp_microbatches": r, "ramp_pieces": q})  # fmt: skip
        times.append(simulate_plan(plan, cost)[0].replicas[0].makespan_ms)
    mine = simulate_plan(auto, cost)[0].replicas[0].makespan_ms
    assert mine <= min(times) * (1 + 1e-12)
    assert list(auto.options["ramp_chosen"][0][0]) in [list(c) for c in candidates]


@given(w=workloads())
def test_auto_pair_order_never_loses_to_any_order_and_records_its_choice(w):
    """``pair_order="auto"`` runs, per replica, the order of lowest predicted makespan among the paper's
    and ``PAIR_ORDER_CANDIDATES`` (under the ramp it chose for the paper's): its simulated makespan is
    at most each fixed order's under that ramp, and its assignment is the recorded order's."""
    cost, layout, samples, auto = _setup((*w[:-1], "auto"))
    groups, works, deferred, *_ = w
    asg = one_iteration(deferral_assignment(groups, deferred))
    plain = generate_plan("entrain", layout, asg, samples, cost, {"ramp_microbatches": "auto"})
    r, q = plain.options["ramp_chosen"][0][0]
    mine = generate_plan(
        "entrain", layout, asg, samples, cost, {"ramp_microbatches": "auto", "pair_order": "auto"}
    )
    (chosen,) = mine.options["pair_order_chosen"][0]
    assert (
        mine.options["pair_order"] == "auto" and mine.options["ramp_chosen"] == plain.options["ramp_chosen"]
    )
    times = {}
    for order in PAIR_ORDERS[:-1]:
        fixed = generate_plan("entrain", layout, asg, samples, cost,
                              {"ramp_microbatches": r, "ramp_pieces": q, "pair_order": order})  # fmt: skip
        validate_plan(fixed)
        times[order] = simulate_plan(fixed, cost)[0].replicas[0].makespan_ms
        if order == chosen:
            assert fixed.iterations[0].assignment == mine.iterations[0].assignment
    validate_plan(mine)
    assert simulate_plan(mine, cost)[0].replicas[0].makespan_ms <= min(times.values()) * (1 + 1e-12)


@pytest.mark.parametrize("system", ["entrain", "entrain-1f1b"])
@given(w=workloads())
def test_split_weight_grads_keeps_the_work_and_never_delays(system, w):
    """Every ``B`` becomes ``I`` then ``W`` in its place: the plan stays valid and deadlock-free, each
    rank's busy time is unchanged, and no rank's finish (hence the makespan) moves later, because a
    gradient only leaves earlier (the per-rank orders are fixed; start times are monotone in them)."""
    cost, layout, samples, plan = _setup(w, system)
    groups, works, deferred, *_, ramp = w
    asg = one_iteration(deferral_assignment(groups, deferred))
    opts = {"ramp_microbatches": ramp}
    if ramp == "auto":  # compare the same order: the ramp the unsplit plan chose
        r, q = plan.options["ramp_chosen"][0][0]
        opts = {"ramp_microbatches": r, "ramp_pieces": q}
        plan = generate_plan(system, layout, asg, samples, cost, opts)
    split = generate_plan(system, layout, asg, samples, cost, {**opts, "split_weight_grads": True})
    validate_plan(split)
    assert split.options["split_weight_grads"] is True
    for g, acts in plan.iterations[0].actions.items():
        kinds = [a.kind for a in split.iterations[0].actions[g] if a.kind.is_compute]
        assert ActionKind.B not in kinds
        assert (
            kinds.count(ActionKind.I)
            == kinds.count(ActionKind.W)
            == [a.kind for a in acts].count(ActionKind.B)
        )
    (base,) = simulate_plan(plan, cost)
    (mine,) = simulate_plan(split, cost)
    a, b = base.replicas[0], mine.replicas[0]
    for g in a.busy_ms:
        assert b.busy_ms[g] == pytest.approx(a.busy_ms[g])
    assert b.makespan_ms <= a.makespan_ms * (1 + 1e-12)
    # per-b (each B as I, W in place) differs only on a fused rank, and never runs faster in time: the
    # slot order only moves I earlier and W later within a slot, so the choice needs memory (setups)
    per_b = generate_plan(system, layout, asg, samples, cost, {**opts, "split_weight_grads": True,
                                                              "backward_order": "per-b"})  # fmt: skip
    fused = {r for r in range(layout.ranks_per_replica) if sum(st.pp_rank == r for st in layout.stages) > 1}
    recorded = (split.options.get("backward_order"), per_b.options.get("backward_order"))
    assert recorded == (("slot", "per-b") if fused else (None, None))
    for g, acts in plan.iterations[0].actions.items():
        compute = [a for a in acts if a.kind.is_compute]
        for got, per_slot in ((split, True), (per_b, False)):
            mine = [a for a in got.iterations[0].actions[g] if a.kind.is_compute]
            assert mine == split_weight_grads(compute, per_slot=per_slot)
        assert per_b.iterations[0].actions[g] == split.iterations[0].actions[g] or g in fused
    (c,) = simulate_plan(per_b, cost)
    assert b.makespan_ms <= c.replicas[0].makespan_ms * (1 + 1e-12) <= a.makespan_ms * (1 + 1e-9)


def test_split_weight_grads_sends_a_slots_gradients_before_its_weight_gradients():
    """A fused rank's backward slot (LLM stage 2, then encoder stage 1, with a deferred sub) runs its
    input gradients first (the encoder's gradient leaves before the LLM's ``W``); a rank's drain of
    one stage keeps ``I`` then ``W`` per microbatch; ``per-b`` keeps each ``B``'s place."""
    from entrain.core.ir.plan import Action

    def acts(spec: str) -> list[Action]:
        return [Action(int(t[1]), ActionKind(t[0]), int(t[2]), int(t[3:] or 0)) for t in spec.split()]

    fused = acts("F10 F20 B20 B10 B101 F11 F21 B21 B11 B22")
    assert split_weight_grads(fused) == acts(
        "F10 F20 I20 I10 I101 W20 W10 W101 F11 F21 I21 I11 W21 W11 I22 W22"
    )
    drain = acts("B05 B06")
    assert split_weight_grads(drain) == acts("I05 W05 I06 W06")
    # backward_order "per-b": each B as I, W in place (the LLM's W, freeing its activations, first)
    assert split_weight_grads(fused, per_slot=False) == acts(
        "F10 F20 I20 W20 I10 W10 I101 W101 F11 F21 I21 W21 I11 W11 I22 W22"
    )
    assert split_weight_grads(drain, per_slot=False) == split_weight_grads(drain)


def test_auto_ramp_is_taken_when_fill_and_drain_dominate():
    """Uniform microbatches, 4 stages, 4 microbatches: halving the fill/drain grain is a clear gain."""
    cost = toy_cost(enc_layers=4, llm_layers=4)
    layout = disjoint_layout(2, 2, k=4)
    ids = [f"s{i}" for i in range(8)]
    samples = raw_samples({s: (4.0, 4.0) for s in ids})
    asg = one_iteration(deferral_assignment([ids[i : i + 2] for i in range(0, 8, 2)], {}))
    auto = generate_plan("entrain", layout, asg, samples, cost, {"ramp_microbatches": "auto"})
    plain = generate_plan("entrain", layout, asg, samples, cost)
    assert auto.options["ramp_chosen"] == [[[3, 2]]]
    t_auto = simulate_plan(auto, cost)[0].iteration_time_ms
    t_plain = simulate_plan(plain, cost)[0].iteration_time_ms
    assert t_auto < t_plain


def test_stages_must_form_a_chain():
    layout = _chain_layout(2, 2, True)
    broken = replace(layout, stages=(*layout.stages[:-1], replace(layout.stages[-1], pp_rank=0)))
    samples = raw_samples({"a": (1.0, 1.0)})
    asg = one_iteration(deferral_assignment([["a"], [], [], []], {}))
    with pytest.raises(ConfigError, match="consecutive"):
        generate_plan("entrain", broken, asg, samples, toy_cost(enc_layers=6, llm_layers=6))
    with pytest.raises(ConfigError, match="ramp_microbatches"):
        generate_plan("entrain", layout, asg, samples, toy_cost(), {"ramp_microbatches": "sometimes"})


def test_memory_realism_counts_model_state_and_activations():
    """18 bytes per trainable parameter (bf16 weight, fp32 grad, fp32 master + AdamW m, v) / TP,
    plus the simulated peak activations; fits_memory compares with the device memory."""
    cost = toy_cost(enc_layers=4, llm_layers=4, param_bytes=3e9)  # 1.5e9 bf16 params per layer
    layout = disjoint_layout(2, 2, k=2)
    samples = raw_samples({s: (4.0, 4.0) for s in "abcd"})
    asg = one_iteration(deferral_assignment([["a", "b"], ["c", "d"]], {}))
    plan = generate_plan("1f1b", layout, asg, samples, cost)
    runs = simulate_plan(plan, cost)
    costs = PlanCosts(layout, cost, samples)
    m = compute_metrics(layout, runs, costs)
    assert m.model_state_bytes_per_rank == [2 * 9 * 3e9] * 4  # two layers a rank, 18 B/param
    assert m.peak_memory_bytes_per_rank == [
        s + a for s, a in zip(m.model_state_bytes_per_rank, m.peak_activation_bytes_per_rank)
    ]
    assert m.fits_memory is False  # 54 GB of model state alone > the default 48 GB
    big = replace(cost, hardware=replace(cost.hardware, device_memory_bytes=1e12))
    assert compute_metrics(layout, runs, PlanCosts(layout, big, samples)).fits_memory is True
    assert compute_metrics(layout, runs).to_json().get("fits_memory") is None  # no costs: no keys
