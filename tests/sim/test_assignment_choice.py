"""Entrain's assignment choice (``ScheduleOptions.assignment``): ``auto`` keeps, per replica and
iteration, the paper's or the two-resource assignment, whichever simulates faster; the choice and the
assignment used are recorded in the Plan; the paper's stays selectable."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.assignment.hierarchical import assign_entrain
from entrain.core.errors import ConfigError
from entrain.core.systems import generate_plan
from entrain.core.validate import validate_plan
from entrain.core.work import SampleWork
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
    plans = {
        a: generate_plan("entrain", layout, asg, samples, cost, {"assignment": a})
        for a in ("paper", "two-resource", "auto")
    }
    for plan in plans.values():
        validate_plan(plan)
    assert "assignment_chosen" not in plans["paper"].options
    assert plans["paper"].iterations[0].assignment == asg[0]  # the paper's, untouched
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


def test_unknown_assignment_is_refused():
    cost, layout, samples, asg = _case(0, 0.5)
    with pytest.raises(ConfigError, match="assignment must be one of paper, two-resource, auto"):
        generate_plan("entrain", layout, asg, samples, cost, {"assignment": "best"})
