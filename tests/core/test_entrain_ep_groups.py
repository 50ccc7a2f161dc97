"""Entrain's plans with expert parallelism give each expert-parallel group one LLM program: the
replicas of a group (``ep`` consecutive ones) run the same LLM computations (kind, stage, microbatch,
sub-microbatch, in one order) on every pipeline rank holding LLM stages, so each sparse layer's
all-to-alls pair up (``runtime.expert_parallel.check_same_actions``) and the simulator's lockstep (by
stage, microbatch and sub) pairs the same computations. Paper assignment, two-resource candidates,
ramped fill/drain, split weight gradients and eager forward on random batches whose replicas would
pick different ``K_eff``; each replica keeps its own encoder microbatches. ``ep`` 1 plans keep each
replica's own ``K_eff``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.assignment.hierarchical import assign_entrain, same_count_per_ep_group
from entrain.core.costs.costmodel import CostModel
from entrain.core.ir.plan import ComponentLayout, Layout, StageSpec
from entrain.core.systems import generate_plan
from entrain.core.workload.samples import SampleMeta
from entrain.sim.executor import simulate_plan
from tests.moe_fixtures import tiny_moe_cost

IMAGES = [(56, 56), (112, 112), (224, 224), (448, 224)]


def _cost() -> CostModel:
    return tiny_moe_cost(2, call_ms=0.001, activation=1000.0)


def _layout(ep: int, dp: int, k: int, u: int) -> Layout:
    return Layout(
        dp=dp,
        microbatch_size=u,
        num_microbatches=k,
        components={"encoder": ComponentLayout(), "llm": ComponentLayout(ep=ep)},
        stages=(StageSpec(0, "encoder", 0, 1, 0), StageSpec(1, "llm", 0, 1, 1), StageSpec(2, "llm", 1, 2, 2)),
    )


def _batch(draw_images, draw_text, n: int, cost: CostModel):
    metas = [
        SampleMeta(f"s{i:02d}", tuple(IMAGES[j] for j in draw_images[i]), draw_text[i]) for i in range(n)
    ]
    return [cost.sample_work(m) for m in metas]


def llm_programs(plan, replica: int) -> dict[int, list[tuple]]:
    """Per pipeline rank with LLM stages: the replica's LLM computations (kind, stage, mb, sub)."""
    layout, it = plan.layout, plan.iterations[0]
    llm = {s.stage for s in layout.stages if s.component == "llm"}
    return {
        r: [
            (a.kind.name, a.stage, a.mb, a.sub)
            for a in it.actions[layout.global_rank(replica, r)]
            if a.kind.is_compute and a.stage in llm
        ]
        for r in sorted({s.pp_rank for s in layout.stages if s.stage in llm})
    }


OPTIONS = [
    {},
    {"ramp_microbatches": "auto", "split_weight_grads": True},
    {"assignment": "auto", "ramp_microbatches": "auto"},
    {"assignment": "two-resource"},
    {"expert_balance": True, "ramp_microbatches": "auto"},
    {"ramp_microbatches": 2, "ramp_pieces": 3},
    {"eager_budget_factor": 2.0, "split_weight_grads": True},
]


@settings(deadline=None, max_examples=25)
@given(
    images=st.lists(st.lists(st.integers(0, len(IMAGES) - 1), max_size=2), min_size=32, max_size=32),
    text=st.lists(st.integers(4, 600), min_size=32, max_size=32),
    options=st.sampled_from(OPTIONS),
    k=st.sampled_from([4, 8]),
)
def test_each_ep_group_runs_one_llm_program(images, text, options, k):
    cost = _cost()
    dp, u = 4, 32 // (4 * k)
    batch = _batch(images, text, 32, cost)
    samples = {s.id: s for s in batch}
    ia = assign_entrain(batch, dp, k)
    plan = generate_plan("entrain", _layout(2, dp, k, u), [ia], samples, cost, options)
    for first in (0, 2):
        assert llm_programs(plan, first) == llm_programs(plan, first + 1), (first, options)
        used = plan.iterations[0].assignment.replicas[first : first + 2]
        assert used[0].k_eff == used[1].k_eff
    ids = sorted(s for rep in plan.iterations[0].assignment.replicas for s in rep.sample_ids)
    assert ids == sorted(samples)  # every sample once
    simulate_plan(plan, cost)  # the simulator runs it (no deadlock)
    dense = generate_plan("entrain", _layout(1, dp, k, u), [ia], samples, cost, options)
    if options.get("assignment", "paper") == "paper":  # ep 1: each replica its own K_eff, as before
        assert [r.k_eff for r in dense.iterations[0].assignment.replicas] == [r.k_eff for r in ia.replicas]


def test_a_group_runs_its_least_k_eff_and_keeps_the_other_groups():
    cost = _cost()
    # replica 0 of 2: one big image and small ones (K_eff 1 of 4), replica 1: even images (K_eff 4)
    one = [SampleMeta(f"a{i}", ((448, 448),) if i == 0 else ((56, 56),), 20) for i in range(4)]
    four = [SampleMeta(f"b{i}", ((112, 112),), 20) for i in range(4)]
    samples = {m.id: cost.sample_work(m) for m in one + four}
    from entrain.core.assignment.hierarchical import assign_replica
    from entrain.core.ir.microbatches import IterationAssignment

    ia = IterationAssignment(
        tuple(assign_replica([samples[m.id] for m in ms], 4) for ms in (one, four, four, four))
    )
    assert [r.k_eff for r in ia.replicas][:2] == [1, 4]
    got = same_count_per_ep_group(ia, samples, 2)
    assert [r.k_eff for r in got.replicas] == [1, 1, 4, 4]
    assert got.replicas[0] == ia.replicas[0] and got.replicas[2:] == ia.replicas[2:]
    assert sorted(got.replicas[1].sample_ids) == sorted(ia.replicas[1].sample_ids)
    assert same_count_per_ep_group(ia, samples, 1) is ia


def test_a_group_runs_its_least_warm_up_on_llm_ranks():
    """A drawn batch whose group's replicas, at one ``K_eff``, would warm up differently on an LLM rank
    (eager forward on their own activations): both run the least."""
    import random

    from entrain.core.ir.graph import ReplicaGraph
    from entrain.core.schedules.action_costs import PlanCosts
    from entrain.core.schedules.entrain import eager_warmups

    cost, rng = _cost(), random.Random(136)
    images = [[rng.randrange(4) for _ in range(rng.randrange(3))] for _ in range(32)]
    text = [rng.randrange(4, 600) for _ in range(32)]
    batch = _batch(images, text, 32, cost)
    samples = {s.id: s for s in batch}
    ia = assign_entrain(batch, 4, 4)
    plan = generate_plan("entrain", _layout(2, 4, 4, 2), [ia], samples, cost, {})
    it, costs = plan.iterations[0], PlanCosts(plan.layout, cost, samples)
    own = [eager_warmups(ReplicaGraph(plan.layout, mbs), costs, 1.25)[0] for mbs in it.microbatches]
    assert any(own[g][1:] != own[g + 1][1:] for g in (0, 2)), own  # they would differ
    for g in (0, 2):
        assert llm_programs(plan, g) == llm_programs(plan, g + 1)


def _position_ms(plan, cost) -> list[list[float]]:
    """Per replica, per executed position: the predicted LLM forward + backward ms of its LLM microbatch."""
    from entrain.core.ir.plan import ActionKind
    from entrain.core.schedules.action_costs import PlanCosts

    costs = PlanCosts(plan.layout, cost, plan.samples)
    llm = [s.stage for s in plan.layout.stages if s.component == "llm"]
    return [
        [
            sum(costs.compute_ms(st, k, mb.llm_ids) for st in llm for k in (ActionKind.F, ActionKind.B))
            for mb in mbs
        ]
        for mbs in plan.iterations[0].microbatches
    ]


@settings(deadline=None, max_examples=25)
@given(
    images=st.lists(st.lists(st.just(0), max_size=1), min_size=32, max_size=32),  # small: K_eff up to 8
    text=st.lists(st.integers(4, 600), min_size=32, max_size=32),
)
def test_expert_balance_runs_heavy_pairs_together(images, text):
    """``expert_balance``: every replica runs its deferral pairs heaviest first (predicted LLM time,
    experts included), so a position's heavy microbatches meet across the EP group, whose sparse
    layers wait for its slowest; the same microbatches, the group's LLM programs still agree; at ``ep``
    1 the plan is unchanged."""
    cost = _cost()
    batch = _batch(images, text, 32, cost)
    samples = {s.id: s for s in batch}
    ia = assign_entrain(batch, 4, 8)
    plain = generate_plan("entrain", _layout(2, 4, 8, 1), [ia], samples, cost, {})
    bal = generate_plan("entrain", _layout(2, 4, 8, 1), [ia], samples, cost, {"expert_balance": True})
    assert bal.options.get("expert_balance") is True and "expert_balance" not in plain.options
    for first in (0, 2):
        assert llm_programs(bal, first) == llm_programs(bal, first + 1)
    before, after = _position_ms(plain, cost), _position_ms(bal, cost)
    for ms in after:
        pairs = [ms[i] + ms[i + 1] for i in range(0, len(ms) - 1, 2)]
        assert all(a >= b - 1e-9 for a, b in zip(pairs, pairs[1:])), pairs
    assert sorted(map(sorted, before)) == sorted(map(sorted, after))  # the same microbatches, reordered
    simulate_plan(bal, cost)
    dense = {"expert_balance": True}
    assert generate_plan("entrain", _layout(1, 4, 8, 1), [ia], samples, cost, dense).iterations == (
        generate_plan("entrain", _layout(1, 4, 8, 1), [ia], samples, cost, {}).iterations
    )
