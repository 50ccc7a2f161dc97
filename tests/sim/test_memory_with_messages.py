"""A rank's simulated peak memory counts the point-to-point messages it holds in flight at each step of
its program (``entrain.core.costs.memory.in_flight_message_bytes``) on top of the activations it
holds at that step; the fit check (``SystemMetrics.fits_memory``) and the planner's memory check
(``fit_memory``) decide on that one count."""

from __future__ import annotations

from dataclasses import replace

from entrain.core.planning.setups import SystemSetup
from entrain.core.workload.work import SampleWork
from entrain.sim.memory_fit import fit_memory
from entrain.sim.run import run_system
from tests.sim.fixtures import disjoint_layout, toy_cost

# big boundary messages (1 byte of output per token against 10 of activations), no model state
COST = toy_cost(act_bytes_per_token=10.0, out_bytes_per_token=1.0)
LAYOUT = disjoint_layout(1, 2, k=6)
BATCHES = [[SampleWork(f"s{i}", 100.0 + 10 * i, 80.0 + 5 * i) for i in range(6)]]


def _run(cost=COST):
    return run_system("1f1b", LAYOUT, BATCHES, cost, {})


def test_peak_counts_the_messages_in_flight_at_one_step():
    m = _run().metrics
    acts, msgs, states = (
        m.peak_activation_bytes_per_rank,
        m.in_flight_message_bytes_per_rank,
        m.model_state_bytes_per_rank,
    )
    assert all(x > 0 for x in msgs)
    held = [p - s for p, s in zip(m.peak_memory_bytes_per_rank, states)]
    assert all(a < h <= a + x for a, h, x in zip(acts, held, msgs))
    # per step, not the sum of the two peaks: the LLM ranks' activations peak while they hold fewer
    # messages than at their message peak
    assert held[1] < acts[1] + msgs[1] and held[2] < acts[2] + msgs[2]
    assert m.memory_json()["in_flight_message_bytes_per_rank"] == msgs


def test_a_configuration_that_fits_without_its_messages_does_not_fit_with_them():
    m = _run().metrics
    peaks, acts = m.peak_memory_bytes_per_rank, m.peak_activation_bytes_per_rank
    tight = (max(peaks) + max(a + s for a, s in zip(acts, m.model_state_bytes_per_rank))) / 2
    assert max(a + s for a, s in zip(acts, m.model_state_bytes_per_rank)) < tight < max(peaks)
    cost = replace(COST, hardware=replace(COST.hardware, device_memory_bytes=tight))
    assert _run(cost).metrics.fits_memory is False
    # the planner's memory check sees the overflow and recomputes where the messages push a rank over
    got, run = fit_memory("1f1b", SystemSetup(LAYOUT, {}, ""), BATCHES, cost)
    assert {s.recompute for s in got.layout.stages} != {"none"}
    assert run.metrics.fits_memory is True


def test_memory_bounded_dip_greedy_keeps_room_for_its_messages():
    """``dip-greedy-mem`` fills device memory with activations up to its budget: the budget leaves room
    for the messages each rank holds in flight, so its plan fits with them counted."""
    from entrain.core.costs.presets import build_cost_model
    from entrain.core.schedules.action_costs import PlanCosts
    from entrain.sim.executor import simulate_plan
    from entrain.sim.metrics import compute_metrics
    from tests.runtime.cases import batch_metas, plan_for, works

    def metrics(system, cost):
        plan = plan_for(system, 2, 2, 1, 8, works(batch_metas(8), cost), cost=cost)
        costs = PlanCosts(plan.layout, cost, plan.samples)
        return compute_metrics(plan.layout, simulate_plan(plan, cost, costs=costs), costs, plan.iterations)

    cost = build_cost_model("tiny", "cpu-tiny")
    unbounded = max(metrics("dip-greedy", cost).peak_memory_bytes_per_rank)
    tight = replace(cost, hardware=replace(cost.hardware, device_memory_bytes=0.9 * unbounded))
    m = metrics("dip-greedy-mem", tight)
    assert min(m.in_flight_message_bytes_per_rank) > 0
    assert m.fits_memory is True
