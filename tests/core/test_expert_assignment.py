"""``expert_assignment``: with expert parallelism, Entrain's assignment may weigh each sample's predicted
busiest-expert time (the router-skew model's busiest rank and the all-to-all, per LLM token at the mean
microbatch: ``schedules.expert_works.expert_works``) beside its encoder and LLM work. Every sample is still
assigned once (an EP group's samples are binned together, so they may move between its replicas), the plan
records the samples' own works, each EP group runs one LLM program; ``ep`` 1 is
unchanged; the planner decides it by simulation (``on`` only past the margin) and lists the decision."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.assignment.hierarchical import assign_entrain, same_count_per_ep_group
from entrain.core.costs.costmodel import CostModel
from entrain.core.ir.plan import ComponentLayout, Layout, StageSpec
from entrain.core.planning.extensions import EP_DECISIONS, EP_GROUP, _decide_expert_assignment
from entrain.core.planning.system_setup import SystemSetup
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.schedules.expert_works import ep_group_bins, expert_works, rank_shares
from entrain.core.systems import generate_plan
from entrain.core.workload.samples import SampleMeta
from entrain.sim.executor import simulate_plan
from tests.moe_fixtures import EXPERTS, tiny_moe_cost

IMAGES = [(56, 56), (112, 112), (224, 224)]


def _cost(skew: float = 4.0) -> CostModel:
    """Two sparse LLM layers whose attention is quadratic in the sequence (so a sample's LLM work and its
    tokens, which the experts' time follows, are not proportional), 8 experts, top 2."""
    experts = replace(EXPERTS, skew=skew)
    return tiny_moe_cost(
        2, experts=experts, call_ms=0.001, quad=4e-5, activation=1000.0, allreduce_bandwidth=1e5
    )


def _layout(ep: int, dp: int, k: int, u: int) -> Layout:
    return Layout(
        dp=dp,
        microbatch_size=u,
        num_microbatches=k,
        components={"encoder": ComponentLayout(), "llm": ComponentLayout(ep=ep)},
        stages=(StageSpec(0, "encoder", 0, 1, 0), StageSpec(1, "llm", 0, 1, 1), StageSpec(2, "llm", 1, 2, 2)),
    )


def _batch(images, text, cost: CostModel):
    metas = [SampleMeta(f"s{i:02d}", tuple(IMAGES[j] for j in images[i]), text[i]) for i in range(len(text))]
    return [cost.sample_work(m) for m in metas]


def _llm_programs(plan, replica: int) -> list[tuple]:
    layout, it = plan.layout, plan.iterations[0]
    llm = {s.stage for s in layout.stages if s.component == "llm"}
    ranks = sorted({s.pp_rank for s in layout.stages if s.stage in llm})
    return [
        (a.kind.name, a.stage, a.mb, a.sub)
        for r in ranks
        for a in it.actions[layout.global_rank(replica, r)]
        if a.kind.is_compute and a.stage in llm
    ]


OPTIONS = [{}, {"assignment": "auto", "ramp_microbatches": "auto"}, {"expert_balance": True}]
GROUP = {"expert_group_bins": True}


@settings(deadline=None, max_examples=8)
@given(
    images=st.lists(st.lists(st.integers(0, len(IMAGES) - 1), max_size=2), min_size=32, max_size=32),
    text=st.lists(st.integers(4, 1200), min_size=32, max_size=32),
    options=st.sampled_from(OPTIONS),
    group=st.sampled_from([{}, GROUP]),
    k=st.sampled_from([2, 4]),
)
def test_every_sample_once_with_its_own_work_and_one_program_per_group(images, text, options, group, k):
    cost = _cost()
    batch = _batch(images, text, cost)
    samples = {s.id: s for s in batch}
    ia = assign_entrain(batch, 4, k)
    plan = generate_plan("entrain", _layout(2, 4, k, 32 // (4 * k)), [ia], samples, cost,
                         {**options, **group, "expert_assignment": True})  # fmt: skip
    assert plan.options["expert_assignment"] is True and plan.options.get("expert_group_bins", False) == bool(
        group
    )
    reps = plan.iterations[0].assignment.replicas
    resplit = plan.options.get("dp_split_chosen", ["paper"]) != ["paper"]  # across every replica
    for first in (0, 2) if not resplit else ():  # each EP group keeps its samples (its replicas may trade)
        given_ids = sorted(s for rep in ia.replicas[first : first + 2] for s in rep.sample_ids)
        assert sorted(s for rep in reps[first : first + 2] for s in rep.sample_ids) == given_ids
    for rep in reps:
        enc = [s for mb in rep.encoder_microbatches for s in mb]
        llm = [s for mb in rep.llm_microbatches for s in mb]
        assert sorted(enc) == sorted(llm) and len(set(enc)) == len(enc)  # every sample once, in both
        assert all(rep.encoder_microbatches)  # no empty microbatch
        for mb, w in zip(rep.llm_microbatches, rep.llm_work):  # the samples' own works, not the weighed
            assert w == pytest.approx(math.fsum(samples[s].llm for s in mb), rel=1e-12)
        for mb, w in zip(rep.encoder_microbatches, rep.encoder_work):
            assert w == pytest.approx(math.fsum(samples[s].encoder for s in mb), rel=1e-12)
    assert sorted(s for rep in reps for s in rep.sample_ids) == sorted(samples)
    for first in (0, 2):
        assert reps[first].k_eff == reps[first + 1].k_eff
        assert _llm_programs(plan, first) == _llm_programs(plan, first + 1)
    simulate_plan(plan, cost)  # it runs (no deadlock)
    # ep 1: the option changes nothing (one rank runs every expert: no busiest-expert excess)
    dense = _layout(1, 4, k, 32 // (4 * k))
    off = generate_plan("entrain", dense, [ia], samples, cost, options)
    on = generate_plan("entrain", dense, [ia], samples, cost, {**options, **group, "expert_assignment": True})
    assert on.iterations == off.iterations


def test_expert_works_add_the_busiest_expert_time_per_token():
    """Each sample's LLM work rises by its tokens times one rate, larger under a skewed router; ``ep`` 1
    adds nothing (the same dict back)."""
    batch = _batch([[0]] * 8, [100 * (i + 1) for i in range(8)], _cost())
    samples = {s.id: s for s in batch}
    ia = assign_entrain(batch, 2, 2)
    rates = {}
    for skew in (1.0, 4.0):
        cost = _cost(skew)
        costs = PlanCosts(_layout(2, 2, 2, 2), cost, samples)
        got = expert_works(costs, samples, [ia])
        extra = {s: got[s].llm - samples[s].llm for s in samples}
        tokens = {s: costs.unit_sums("llm", s)[1] for s in samples}
        assert all(v > 0 for v in extra.values())
        rate = {extra[s] / tokens[s] for s in samples}
        assert max(rate) == pytest.approx(min(rate), rel=1e-9)
        assert all(got[s].encoder == samples[s].encoder and got[s].id == s for s in samples)
        rates[skew] = min(rate)
    assert rates[4.0] > rates[1.0]
    dense = PlanCosts(_layout(1, 2, 2, 2), _cost(), samples)
    assert expert_works(dense, samples, [ia]) is samples


def test_the_weighed_assignment_moves_samples_where_work_and_tokens_disagree():
    """Long texts cost more LLM work per token (attention) than short ones; weighing the experts' time per
    token moves the LLM microbatches (the option is not inert)."""
    cost = _cost(8.0)
    rows = [(0, 197), (0, 749), (0, 641), (1, 444), (2, 83), (2, 334), (1, 815), (2, 1052), (1, 1124),
            (1, 1038), (1, 83), (0, 755), (1, 662), (1, 877), (2, 346), (2, 373)]  # fmt: skip
    batch = _batch([[i] for i, _ in rows], [t for _, t in rows], cost)
    samples = {s.id: s for s in batch}
    ia = assign_entrain(batch, 2, 4)
    off = generate_plan("entrain", _layout(2, 2, 4, 2), [ia], samples, cost, {})
    llm = [r.llm_microbatches for r in off.iterations[0].assignment.replicas]
    for extra in ({}, GROUP):
        on = generate_plan(
            "entrain", _layout(2, 2, 4, 2), [ia], samples, cost, {"expert_assignment": True, **extra}
        )
        assert [r.llm_microbatches for r in on.iterations[0].assignment.replicas] != llm


def _setup(ep: int) -> SystemSetup:
    return SystemSetup(_layout(ep, 4, 4, 2), {}, "hand")


@pytest.mark.parametrize(("on_ms", "chosen"), [(95.0, "on"), (99.5, "off")])
def test_the_decision_is_by_simulation_past_the_margin_and_recorded(on_ms, chosen):
    seen = []

    def judge(cands):
        seen.append(sorted(cands))
        return {n: (on_ms if s.options.get("expert_assignment") else 100.0) for n, s in cands.items()}

    got = _decide_expert_assignment(_setup(2), judge, 0.02)
    (d,) = got.decisions
    assert d.name == "expert_assignment" and d.chosen == chosen and d.default == "off"
    assert d.candidates == {"off": 100.0, "on": on_ms, EP_GROUP: on_ms}  # ties: the earlier, "on"
    assert got.options.get("expert_assignment", False) is (chosen == "on")
    assert "expert_group_bins" not in got.options
    assert "expert_assignment" in EP_DECISIONS and seen == [sorted(["off", "on", EP_GROUP])]
    assert _decide_expert_assignment(_setup(1), judge, 0.02) == _setup(1)  # ep 1: nothing to decide


@settings(deadline=None, max_examples=30)
@given(
    images=st.lists(st.lists(st.integers(0, len(IMAGES) - 1), max_size=2), min_size=16, max_size=16),
    text=st.lists(st.integers(4, 1200), min_size=16, max_size=16),
)
def test_a_groups_microbatches_are_binned_together_within_the_lpt_bound(images, text):
    """``ep_group_bins``: an EP group's samples, each once, in ``ep * k`` non-empty microbatches whose
    largest per-rank load is within the list-scheduling bound (mean + the largest sample)."""
    cost = _cost()
    batch = _batch(images, text, cost)
    samples = {s.id: s for s in batch}
    ia = same_count_per_ep_group(assign_entrain(batch, 4, 2), samples, 2)
    costs = PlanCosts(_layout(2, 4, 2, 2), cost, samples)
    works = expert_works(costs, samples, [ia])
    got = ep_group_bins(ia, works, 2, costs)
    for first in (0, 2):
        group, mine = ia.replicas[first : first + 2], got.replicas[first : first + 2]
        if group == mine:  # kept: an empty microbatch (fewer samples than microbatches)
            continue
        assert sorted(s for r in mine for s in r.sample_ids) == sorted(s for r in group for s in r.sample_ids)
        assert [r.k_eff for r in mine] == [r.k_eff for r in group]
        shares = rank_shares(costs, [s for r in group for s in r.sample_ids]).matrix()
        load = [
            max(sum(works[s].encoder * a + works[s].llm * b for s in mb) for a, b in shares)
            for r in mine
            for mb in r.encoder_microbatches
        ]
        per = [
            max(works[s].encoder * a + works[s].llm * b for a, b in shares)
            for r in mine
            for s in r.sample_ids
        ]
        total = [
            sum(works[s].encoder * a + works[s].llm * b for r in mine for s in r.sample_ids)
            for a, b in shares
        ]
        assert max(load) <= sum(total) / len(load) + max(per) + 1e-9  # the vector LPT bound
