"""Entrain's assignment choice (``ScheduleOptions.assignment``): ``auto`` keeps, per iteration, the
paper's DP split or the two-resource one, whichever balances the replicas' per-rank loads better, and
per replica the paper's or the two-resource assignment, whichever simulates faster; the choices and
the assignment used are recorded in the Plan; the paper's stays selectable."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.assignment.hierarchical import assign_entrain
from entrain.core.assignment.two_resource import replica_loads
from entrain.core.errors import ConfigError
from entrain.core.ir.validate import validate_plan
from entrain.core.schedules import entrain as entrain_schedule
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.schedules.entrain import balanced_dp_split, rank_shares
from entrain.core.systems import generate_plan
from entrain.core.workload.work import SampleWork
from entrain.sim.executor import simulate_plan
from tests.sim.fixtures import disjoint_layout, toy_cost


def _case(seed: int, text_only: float, dp: int = 2, k: int = 4, enc_pp: int = 2, llm_pp: int = 2):
    rng = random.Random(seed)
    batch = []
    for i in range(dp * k * 3):
        llm = rng.lognormvariate(2.5, 0.7)
        enc = 0.0 if rng.random() < text_only else rng.uniform(0.5, 8.0)
        batch.append(SampleWork(f"s{i:03d}", round(enc, 3), round(llm, 3)))
    cost = toy_cost(enc_layers=4, llm_layers=4, call_ms=0.05)
    layout = disjoint_layout(enc_pp, llm_pp, dp=dp, k=k)
    samples = {s.id: s for s in batch}
    return cost, layout, samples, [assign_entrain(batch, dp, k)]


def _iteration_ms(plan, cost) -> float:
    return simulate_plan(plan, cost)[0].iteration_time_ms


@settings(max_examples=20)
@given(
    seed=st.integers(0, 10_000),
    text_only=st.sampled_from([0.0, 0.5, 0.9]),
    pp=st.sampled_from([(1, 3), (2, 2)]),
)
def test_auto_never_loses_and_records_its_choice(seed, text_only, pp):
    cost, layout, samples, asg = _case(seed, text_only, enc_pp=pp[0], llm_pp=pp[1])
    paper = generate_plan("entrain", layout, asg, samples, cost, {"assignment": "paper"})
    assert "assignment_chosen" not in paper.options and "dp_split_chosen" not in paper.options
    assert paper.iterations[0].assignment == asg[0]  # the paper's, untouched
    plans = {
        a: generate_plan("entrain", layout, asg, samples, cost, {"assignment": a})
        for a in ("two-resource", "auto")
    }
    split = plans["auto"].options["dp_split_chosen"]
    assert split == plans["two-resource"].options["dp_split_chosen"]  # chosen the same way by both
    if split == ["two-resource"]:  # per replica, compare on that DP split
        asg = [
            balanced_dp_split(asg[0], samples, PlanCosts(layout, cost, samples), layout.num_microbatches)[1]
        ]
    plans["paper"] = generate_plan("entrain", layout, asg, samples, cost, {"assignment": "paper"})
    for plan in plans.values():
        validate_plan(plan)
    chosen = plans["auto"].options["assignment_chosen"]
    assert len(chosen) == 1 and len(chosen[0]) == layout.dp
    assert set(chosen[0]) <= {"paper", "two-resource"}
    for r, name in enumerate(chosen[0]):  # the Plan records the assignment it runs
        used = plans["auto"].iterations[0].assignment.replicas[r]
        assert used == plans[name].iterations[0].assignment.replicas[r]
    per_replica = {a: simulate_plan(p, cost)[0].replicas for a, p in plans.items()}
    for r in range(layout.dp):
        best = min(per_replica[a][r].makespan_ms for a in ("paper", "two-resource"))
        assert per_replica["auto"][r].makespan_ms <= best * (1 + 1e-12)


def test_llm_dominant_picks_two_resource_and_is_faster():
    cost, layout, samples, asg = _case(3, text_only=0.9, enc_pp=1, llm_pp=3)
    paper = generate_plan("entrain", layout, asg, samples, cost, {"assignment": "paper"})
    auto = generate_plan("entrain", layout, asg, samples, cost, {"assignment": "auto"})
    assert "two-resource" in auto.options["assignment_chosen"][0]
    assert _iteration_ms(auto, cost) < _iteration_ms(paper, cost)


def _largest_rank_load(plan, layout, cost, samples) -> float:
    reps = [[samples[s] for s in r.sample_ids] for r in plan.iterations[0].assignment.replicas]
    return float(replica_loads(reps, rank_shares(PlanCosts(layout, cost, samples), sorted(samples))).max())


@settings(max_examples=20)
@given(
    seed=st.integers(0, 10_000),
    text_only=st.sampled_from([0.5, 0.9]),
    pp=st.sampled_from([(1, 3), (2, 2)]),
)
def test_llm_dominant_dp_split_never_above_the_papers(seed, text_only, pp):
    """On LLM-dominant draws over 4 replicas, auto's busiest replica rank carries no more work than
    under the paper's DP split (encoder order, greedy on LLM load: long texts that come last pile up
    where the sample count leaves room)."""
    cost, layout, samples, asg = _case(seed, text_only, dp=4, enc_pp=pp[0], llm_pp=pp[1])
    paper = generate_plan("entrain", layout, asg, samples, cost, {"assignment": "paper"})
    auto = generate_plan("entrain", layout, asg, samples, cost, {"assignment": "auto"})
    assert len(auto.options["dp_split_chosen"]) == 1
    mine, papers = (_largest_rank_load(p, layout, cost, samples) for p in (auto, paper))
    assert mine <= papers * (1 + 1e-12)


def test_llm_dominant_dp_split_is_rebalanced_and_faster(monkeypatch):
    cost, layout, samples, asg = _case(7, text_only=0.9, dp=4, enc_pp=1, llm_pp=3)
    auto = generate_plan("entrain", layout, asg, samples, cost, {"assignment": "auto"})
    monkeypatch.setattr(entrain_schedule, "balanced_dp_split", lambda ia, *_: ("paper", ia))
    kept = generate_plan("entrain", layout, asg, samples, cost, {"assignment": "auto"})  # paper's DP split
    assert auto.options["dp_split_chosen"] == ["two-resource"]
    mine, papers = (_largest_rank_load(p, layout, cost, samples) for p in (auto, kept))
    assert mine < 0.9 * papers
    assert _iteration_ms(auto, cost) < _iteration_ms(kept, cost)


def test_dp_split_kept_where_the_gain_is_small_or_not_predicted(monkeypatch):
    """The per-rank load favours the re-split here (by about 19 %); a prediction that does not (equal
    times) keeps the paper's split, and so does a minimum gain above it."""
    cost, layout, samples, asg = _case(7, text_only=0.9, dp=4, enc_pp=1, llm_pp=3)
    costs, k = PlanCosts(layout, cost, samples), layout.num_microbatches
    assert balanced_dp_split(asg[0], samples, costs, k)[0] == "two-resource"
    assert balanced_dp_split(asg[0], samples, costs, k, predict=lambda rep: 1.0) == ("paper", asg[0])
    monkeypatch.setattr(entrain_schedule, "DP_SPLIT_MIN_GAIN", 0.5)
    assert balanced_dp_split(asg[0], samples, costs, k) == ("paper", asg[0])


def test_unknown_assignment_is_refused():
    cost, layout, samples, asg = _case(0, 0.5)
    with pytest.raises(ConfigError, match="assignment must be one of paper, two-resource, auto"):
        generate_plan("entrain", layout, asg, samples, cost, {"assignment": "best"})
