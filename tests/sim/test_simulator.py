"""The discrete-event simulator: analytic cases, accounting invariants, and properties over random
workloads for every generator."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from entrain.core.ir.plan import ActionKind
from entrain.core.ir.validate import validate_plan
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.schedules.one_f_one_b import one_f_one_b_makespan
from entrain.core.systems import SYSTEMS, generate_plan
from entrain.sim.executor import simulate_plan
from entrain.sim.metrics import compute_metrics
from tests.sim.fixtures import (
    colocated_layout,
    deferral_assignment,
    disjoint_layout,
    draw_grouped_work,
    one_iteration,
    plain_assignment,
    raw_samples,
    toy_cost,
)


def _uniform_plan(m: int, enc_pp: int, llm_pp: int, cost):
    layout = disjoint_layout(enc_pp, llm_pp, k=m, enc_layers=enc_pp * 2, llm_layers=llm_pp * 2)
    ids = [f"s{i}" for i in range(m)]
    samples = raw_samples({s: (6.0 * enc_pp, 6.0 * llm_pp) for s in ids})
    return generate_plan("1f1b", layout, one_iteration(plain_assignment([[s] for s in ids])), samples, cost)


@pytest.mark.parametrize(("m", "enc_pp", "llm_pp"), [(1, 1, 1), (4, 2, 2), (8, 3, 1), (3, 2, 3), (16, 4, 4)])
def test_uniform_1f1b_makespan_is_m_plus_p_minus_1_times_f_plus_b(m, enc_pp, llm_pp):
    cost = toy_cost(enc_layers=enc_pp * 2, llm_layers=llm_pp * 2)
    plan = _uniform_plan(m, enc_pp, llm_pp, cost)
    # 6 ms of work per stage: 2 layers of (1 fwd + 2 bwd) ms/token -> x = 1 token, F = 2, B = 4.
    run = simulate_plan(plan, cost)[0]
    p = enc_pp + llm_pp
    assert run.iteration_time_ms == pytest.approx((m + p - 1) * (2.0 + 4.0))
    assert one_f_one_b_makespan([2.0] * p, [4.0] * p, m) == pytest.approx((m + p - 1) * 6.0)


def test_p2p_latency_adds_on_the_critical_path():
    cost = toy_cost(enc_layers=2, llm_layers=2, latency_ms=0.5)
    plan = _uniform_plan(1, 1, 1, cost)
    # one microbatch, two stages: F0, (send), F1, B1, (send), B0 -> 2 transfers.
    assert simulate_plan(plan, cost)[0].iteration_time_ms == pytest.approx(2 * 6.0 + 2 * 0.5)
    assert simulate_plan(plan, cost, comm=False)[0].iteration_time_ms == pytest.approx(12.0)


def test_dp_allreduce_is_added_after_the_last_backward():
    cost = toy_cost(enc_layers=2, llm_layers=2, param_bytes=1e6)
    layout = disjoint_layout(1, 1, dp=2, k=1, enc_layers=2, llm_layers=2)
    samples = raw_samples({"a": (6.0, 6.0), "b": (6.0, 6.0)})
    plan = generate_plan(
        "1f1b", layout, one_iteration(plain_assignment([["a"]]), plain_assignment([["b"]])), samples, cost
    )
    run = simulate_plan(plan, cost)[0]
    # 2 layers x 1e6 B per rank; ring factor 2 (dp-1)/dp = 1; 1e6 B/ms -> 2 ms; rank 0 ends last.
    assert run.allreduce_ms == {0: pytest.approx(2.0), 1: pytest.approx(2.0)}
    assert run.iteration_time_ms == pytest.approx(12.0 + 2.0)


def test_activation_memory_of_1f1b_warmup():
    cost = toy_cost(enc_layers=2, llm_layers=2, act_bytes_per_token=10.0)
    plan = _uniform_plan(6, 1, 1, cost)
    run = simulate_plan(plan, cost)[0].replicas[0]
    # 1 token per microbatch, 2 layers x 10 B per stage: stage 0 holds p = 2 microbatches at peak.
    assert run.peak_bytes[0] == pytest.approx(2 * 20.0)
    assert run.peak_bytes[1] == pytest.approx(1 * 20.0)


def test_raw_work_splits_over_stages_by_linear_cost_share():
    cost = toy_cost(enc_layers=3, llm_layers=1)
    layout = disjoint_layout(2, 1, k=1, enc_layers=3, llm_layers=1)  # encoder stages hold 2 and 1 layers
    costs = PlanCosts(layout, cost, raw_samples({"a": (9.0, 3.0)}))
    # encoder work 9 over 3 equal layers: stage 0 gets 6 (F 2, B 4), stage 1 gets 3 (F 1, B 2).
    assert costs.compute_ms(0, ActionKind.F, ["a"]) == pytest.approx(2.0)
    assert costs.compute_ms(0, ActionKind.B, ["a"]) == pytest.approx(4.0)
    assert costs.compute_ms(1, ActionKind.F, ["a"]) == pytest.approx(1.0)
    assert costs.compute_ms(2, ActionKind.B, ["a"]) == pytest.approx(2.0)


def test_per_call_constant_is_paid_per_sub_microbatch():
    cost = toy_cost(enc_layers=1, llm_layers=1, call_ms=1.0)
    layout = disjoint_layout(1, 1, k=2, enc_layers=1, llm_layers=1)
    samples = raw_samples({s: (3.0, 3.0) for s in "abcd"})
    asg = one_iteration(deferral_assignment([["a", "b"], ["c", "d"]], {"b": (0, 1)}))
    plan = generate_plan("entrain-1f1b", layout, asg, samples, cost)
    run = simulate_plan(plan, cost)[0].replicas[0]
    # encoder microbatch 0 runs as two subs: two forward calls -> two constants.
    assert run.fwd_ms[(0, 0, 0)] == pytest.approx(1.0 + 1.0)
    assert run.fwd_ms[(0, 0, 1)] == pytest.approx(1.0 + 1.0)
    assert run.fwd_ms[(0, 1, 0)] == pytest.approx(2.0 + 1.0)


def test_text_only_encoder_call_costs_nothing():
    """The runtime skips the encoder for a (sub-)microbatch without images: no per-call constant
    (measured ~0.1 ms where the simulator charged the constants)."""
    cost = toy_cost(enc_layers=1, llm_layers=1, call_ms=1.0)
    costs = PlanCosts(disjoint_layout(1, 1, k=1, enc_layers=1, llm_layers=1), cost,
                      raw_samples({"t": (0.0, 3.0), "i": (3.0, 3.0)}))  # fmt: skip
    for kind in (ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W):
        assert costs.compute_ms(0, kind, ["t"]) == 0.0
    assert costs.compute_ms(0, ActionKind.F, ["t", "i"]) == pytest.approx(1.0 + 1.0)  # one call, one constant
    assert costs.compute_ms(1, ActionKind.F, ["t"]) == pytest.approx(1.0 + 1.0)  # the LLM still runs


def test_entrain_split_backward_runs_deferred_sub_after_partner_llm_backward():
    cost = toy_cost(enc_layers=2, llm_layers=2)
    layout = disjoint_layout(1, 1, k=2, enc_layers=2, llm_layers=2)
    samples = raw_samples({s: (3.0, 3.0) for s in "abcd"})
    asg = one_iteration(deferral_assignment([["a", "b"], ["c", "d"]], {"b": (0, 1)}))
    plan = generate_plan("entrain-1f1b", layout, asg, samples, cost)
    spans = {(str(s.action)): s for s in simulate_plan(plan, cost)[0].replicas[0].spans}
    assert spans["0B0.1"].start_ms >= spans["1B1"].end_ms
    assert spans["0B0.0"].start_ms >= spans["1B0"].end_ms
    assert spans["0B0.0"].end_ms <= spans["0B0.1"].start_ms


# --- properties over random workloads, every generator ------------------------------------------
@st.composite
def workloads(draw):
    groups, works, deferred = draw_grouped_work(draw, st, max_mbs=5, max_per_mb=3, min_mbs=1)
    enc_pp = draw(st.integers(1, 3))
    llm_pp = draw(st.integers(1, 3))
    dp = draw(st.integers(1, 2))
    latency = draw(st.sampled_from([0.0, 0.3]))
    ramp = draw(st.sampled_from([0, 0, 1, 2]))
    return groups, works, deferred, enc_pp, llm_pp, dp, latency, ramp


def _reps(groups, deferred, dp, system):
    reps = []
    for r in range(dp):
        rename = [[f"{s}r{r}" for s in g] for g in groups]
        if system.startswith("entrain"):
            reps.append(deferral_assignment(rename, {f"{s}r{r}": v for s, v in deferred.items()}))
        else:
            reps.append(plain_assignment(rename))
    return one_iteration(*reps)


@pytest.mark.parametrize("system", sorted(SYSTEMS))
@given(w=workloads())
def test_every_generator_valid_deadlock_free_and_accounted(system, w):
    groups, works, deferred, enc_pp, llm_pp, dp, latency, ramp = w
    cost = toy_cost(enc_layers=6, llm_layers=6, call_ms=0.1, out_bytes_per_token=1e5, latency_ms=latency)
    if system.startswith("dip"):
        layout = colocated_layout(max(enc_pp, llm_pp), dp=dp, k=len(groups), enc_layers=6, llm_layers=6)
    else:
        layout = disjoint_layout(enc_pp, llm_pp, dp=dp, k=len(groups), enc_layers=6, llm_layers=6)
    samples = raw_samples({f"{s}r{r}": v for s, v in works.items() for r in range(dp)})
    plan = generate_plan(
        system,
        layout,
        _reps(groups, deferred, dp, system),
        samples,
        cost,
        {"dip_encoder_cap_patches": 2.0, "dip_llm_cap_tokens": 2.0},
    )
    validate_plan(plan)
    runs = simulate_plan(plan, cost)
    costs = PlanCosts(layout, cost, samples)
    it = plan.iterations[0]
    for rep_run in runs[0].replicas:
        for g, busy in rep_run.busy_ms.items():
            spec = it.microbatches[layout.replica_of(g)[0]]
            expected = 0.0
            for a in it.actions[g]:
                if a.kind.is_compute:
                    enc = a.stage < layout.num_encoder_stages
                    ids = (spec[a.mb].encoder_subs if enc else spec[a.mb].llm_subs)[a.sub_index]
                    expected += costs.compute_ms(a.stage, a.kind, ids)
            assert busy == pytest.approx(expected)
    metrics = compute_metrics(layout, runs)
    assert metrics.iteration_time_ms >= metrics.lower_bound_ms * (1 - 1e-12)
    assert 0.0 <= metrics.bubble_ratio <= 1.0
    assert math.isfinite(metrics.partition_ideal_ms) and metrics.ideal_ms > 0


def test_ramp_cuts_first_and_last_microbatches_into_balanced_pieces():
    cost = toy_cost(enc_layers=2, llm_layers=2)
    layout = disjoint_layout(1, 1, k=3, enc_layers=2, llm_layers=2)
    samples = raw_samples({s: (float(i + 1), 1.0) for i, s in enumerate("abcdefgh")})
    asg = one_iteration(deferral_assignment([["a", "b", "c"], ["d", "e"], ["f", "g", "h"]], {"c": (0, 1)}))
    plan = generate_plan("entrain", layout, asg, samples, cost, {"ramp_microbatches": 1})
    validate_plan(plan)
    mbs = plan.iterations[0].microbatches[0]
    assert mbs[0].encoder_subs == (("a",), ("b",), ("c",))  # kept part in 2 pieces, deferred sub last
    assert mbs[0].llm_subs == (("a",), ("b",))
    assert mbs[1].encoder_subs == (("d", "e"),)  # the middle microbatch is untouched
    assert mbs[2].encoder_subs == (("f", "g"), ("h",))
    assert mbs[2].llm_subs == (("f", "g"), ("h",))
    simulate_plan(plan, cost)


def test_simulator_reports_a_deadlocked_plan_with_the_grid():
    from dataclasses import replace

    from entrain.core.errors import ScheduleError
    from entrain.core.ir.plan import Action

    cost = toy_cost(enc_layers=2, llm_layers=2)
    plan = _uniform_plan(3, 1, 1, cost)
    it = plan.iterations[0]
    acts = list(it.actions[1])
    acts.remove(Action.parse("1RECV_F1"))
    acts.append(Action.parse("1RECV_F1"))  # rank 1 would wait for F1 forever
    broken = replace(plan, iterations=(replace(it, actions={**it.actions, 1: tuple(acts)}),))
    with pytest.raises(ScheduleError, match=r"deadlock in simulation: rank 1 step \d+ \(1F1\)") as err:
        simulate_plan(broken, cost)
    assert "<-- ERROR HERE" in str(err.value)


def test_split_backward_input_weight_actions_validate_and_simulate():
    """I (backward for inputs) then W (weights) instead of B: lowering sends gradients after I,
    the validator accepts it and the simulator charges half a backward to each."""
    from entrain.core.ir.graph import ReplicaGraph
    from entrain.core.ir.plan import Action, IterationPlan
    from entrain.core.schedules.lowering import add_comms, strip_comms

    cost = toy_cost(enc_layers=2, llm_layers=2)
    plan = _uniform_plan(3, 1, 1, cost)
    it = plan.iterations[0]
    graph = ReplicaGraph(plan.layout, it.microbatches[0])
    compute = {}
    for rank, acts in it.actions.items():
        out = []
        for a in strip_comms(acts):
            if a.kind is ActionKind.B:
                out += [
                    Action(a.stage, ActionKind.I, a.mb, a.sub),
                    Action(a.stage, ActionKind.W, a.mb, a.sub),
                ]
            else:
                out.append(a)
        compute[rank] = out
    lowered = add_comms(graph, compute)
    assert "1I0 1SEND_B0 1W0" in " ".join(str(a) for a in lowered[1])
    split = replace(
        plan,
        iterations=(
            IterationPlan(it.assignment, it.microbatches, {r: tuple(a) for r, a in lowered.items()}),
        ),
    )
    validate_plan(split)
    run = simulate_plan(split, cost)[0]
    assert run.replicas[0].busy_ms == simulate_plan(plan, cost)[0].replicas[0].busy_ms
    assert run.iteration_time_ms <= simulate_plan(plan, cost)[0].iteration_time_ms
