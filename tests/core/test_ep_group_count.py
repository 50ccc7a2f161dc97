"""An expert-parallel group runs one microbatch count on its LLM stages; Entrain's generator gives the
group the count whose slowest replica is predicted fastest, from the least any replica's own rule
(``K_eff``) allows to the most. One replica with a dominant image (its rule: 1 microbatch) no longer drags
the whole group to one coarse microbatch (no pipelining at all); it runs the group's count with its big
sample alone in one microbatch, and the plan simulates faster than at the least count."""

from __future__ import annotations

from entrain.core.assignment.hierarchical import assign_replica, same_count_per_ep_group
from entrain.core.ir.microbatches import IterationAssignment
from entrain.core.systems import generate_plan
from entrain.core.workload.samples import SampleMeta
from entrain.sim.executor import simulate_plan
from tests.core.test_entrain_ep_groups import _cost, _layout


def _assignment(cost):
    one = [SampleMeta(f"a{i}", ((448, 448),) if i == 0 else ((56, 56),), 200) for i in range(4)]
    four = [SampleMeta(f"b{i}", ((112, 112),), 200) for i in range(4)]
    samples = {m.id: cost.sample_work(m) for m in one + four}
    ia = IterationAssignment(tuple(assign_replica([samples[m.id] for m in ms], 4) for ms in (one, four)))
    assert [r.k_eff for r in ia.replicas] == [1, 4]
    return ia, samples


def test_the_group_runs_the_count_predicted_fastest_not_its_least():
    cost = _cost()
    ia, samples = _assignment(cost)
    layout = _layout(2, 2, 4, 1)
    plan = generate_plan("entrain", layout, [ia], samples, cost, {})
    used = plan.iterations[0].assignment.replicas
    assert used[0].k_eff == used[1].k_eff == 4
    assert sorted(used[0].sample_ids) == sorted(ia.replicas[0].sample_ids)
    assert ("a0",) in used[0].encoder_microbatches  # the big sample alone
    least = same_count_per_ep_group(ia, samples, 2)  # without a prediction: the group's least K_eff
    assert [r.k_eff for r in least.replicas] == [1, 1]
    coarse = generate_plan("entrain", layout, [least], samples, cost, {})
    assert simulate_plan(plan, cost)[0].iteration_time_ms < simulate_plan(coarse, cost)[0].iteration_time_ms


def test_a_prediction_that_prefers_fewer_keeps_the_least():
    cost = _cost()
    ia, samples = _assignment(cost)
    got = same_count_per_ep_group(ia, samples, 2, predict=lambda r: float(r.k_eff))
    assert [r.k_eff for r in got.replicas] == [1, 1]
    got = same_count_per_ep_group(ia, samples, 2, predict=lambda r: -float(r.k_eff))
    assert [r.k_eff for r in got.replicas] == [4, 4]
