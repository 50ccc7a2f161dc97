"""A decision's candidates do not affect each other or the chosen plan: the judge
(``entrain.sim.choose.candidate_judge``) answers each candidate's time whatever it simulated before, so
simulating extra candidates, or the candidates in another order, leaves every decision (its candidates'
times and its choice), the chosen plan and that plan's simulated time unchanged.

The regression run that prompted it: chartqa + 1B (a40-paper) Entrain moved 9545.7 -> 9507.5 ms when
the ``encoder_rebalance`` decision stopped listing ``on`` on the boundary-sharing layout; the chosen plan
itself had changed (``on`` had been chosen: its row's source ends "encoder rebalanced across replicas"),
and with ``on`` simulated but ``off`` chosen the time is 9507.5 ms, as without it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from entrain.core.costs.presets import resolve_cost_model
from entrain.core.planning.setups import DECISIONS, ConfigRequest, SystemSetup, system_setups
from entrain.data.sampling import dataset_sampler
from entrain.sim.choose import candidate_judge, planner_draws
from entrain.sim.memory_fit import deploy

REQ = ConfigRequest("text-heavy", "qwen25vl-llama3-1b", 16, 2, 2, 64, 4, seed=0)
"""A small case (DP 2) where the shared layout is chosen: ``encoder_rebalance`` lists ``off`` alone."""

CASES = {"auto": REQ, "disjoint": replace(REQ, entrain_layout="disjoint")}
"""``disjoint``: the encoder and LLM on different ranks, so ``encoder_rebalance`` simulates ``on`` too."""

FLIPS = (
    ("encoder_rebalance", True),
    ("memory_split", False),
    ("ramp_microbatches", "auto"),
    ("split_weight_grads", True),
    ("assignment", "two-resource"),
)
"""Options set on each candidate to make the extra candidates (every decision's non-default value)."""


def _meddling(judge, extras: list[SystemSetup]):
    """``judge``, but each call first simulates extra candidates (each candidate with one of ``FLIPS``'
    options set, recorded in ``extras``), then the candidates in reverse order."""

    def meddled(candidates: dict[str, SystemSetup]) -> dict[str, float]:
        more = {
            f"{n} +{option}": replace(s, options={**s.options, option: value})
            for n, s in candidates.items()
            for option, value in FLIPS
            if s.options.get(option) != value
        }
        extras.extend(more.values())
        judge({**more, **dict(reversed(candidates.items()))})
        return judge(candidates)

    meddled.deployed = judge.deployed  # type: ignore[attr-defined]  # the deployed check as the plain run's
    return meddled


def _chosen(req: ConfigRequest, meddle: bool):
    """``(Entrain's chosen setup, its simulated ms on two other batches, the extra candidates)``, with a
    fresh judge, meddled with or not."""
    cost = resolve_cost_model(req.model, hardware="a40-paper")
    sampler = dataset_sampler(req.dataset, req.seed)
    extras: list[SystemSetup] = []
    judge = candidate_judge(sampler, cost, req)
    setup = system_setups(["entrain"], req, cost, sampler, _meddling(judge, extras) if meddle else judge)
    run_req = replace(req, seed=req.seed + 1)
    batches = planner_draws(dataset_sampler(req.dataset, run_req.seed), cost, run_req)
    chosen, run = deploy("entrain", setup["entrain"], batches, cost)
    return chosen, run.metrics.iteration_time_ms, extras


def _summary(setup: SystemSetup) -> tuple:
    return setup.layout, setup.options, [(d.name, d.chosen, d.candidates) for d in setup.decisions]


@pytest.mark.parametrize("case", list(CASES))
def test_simulating_extra_candidates_leaves_the_chosen_plan_and_its_time_unchanged(case):
    req = CASES[case]
    plain, plain_ms, _ = _chosen(req, meddle=False)
    meddled, meddled_ms, extras = _chosen(req, meddle=True)
    assert [d.name for d in plain.decisions] == [n for n in DECISIONS if n != "layout" or case == "auto"]
    assert _summary(meddled) == _summary(plain)
    assert meddled_ms == plain_ms
    rebalance = {d.name: d for d in plain.decisions}["encoder_rebalance"]
    if case == "auto":  # the regression's case: "on" simulated on a layout that cannot carry it
        assert not plain.layout.can_move_encoder_work and set(rebalance.candidates) == {"off"}
        assert any(s.options.get("encoder_rebalance") and not s.layout.can_move_encoder_work for s in extras)
    else:
        assert set(rebalance.candidates) == {"off", "on"}
