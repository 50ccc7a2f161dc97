"""A decision none of whose candidates fits on the judge's plain memory check (the planner's
recomputation escalated per rank overflows a rank of each: every time ``inf``) is decided on the memory
check a command deploys with (``judge.deployed``: ``sim.memory_fit.fit_memory_best``'s other starts,
the requested microbatch count, the two-resource assignment), which is what the command runs; a
decision with any fitting candidate never asks it."""

from __future__ import annotations

import pytest

from entrain.core.planning.setups import entrain_variant
from tests.sim.test_close_calls import _judge
from tests.sim.test_decisions import REQ, _base, _decisions

INF = float("inf")
NOTHING_FITS = {("assignment", a): INF for a in ("paper", "two-resource", "auto")}
"""Every assignment candidate overflows on the plain check, and so every later candidate (each keeps
the assignment chosen)."""


def test_where_nothing_fits_on_the_plain_check_the_deployed_check_decides():
    """mixture / Qwen3VL-30B-A3B (64 GPUs, DP 1): no candidate of any schedule-option decision fitted
    on the plain check, so each kept its default on ``inf`` against ``inf`` (the paper's assignment, no
    split backward) whatever the deployed plans did. Planted bug: decided on the plain check alone:
    ``paper`` and ``off`` stay."""
    cost, base = _base()
    deployed = {("assignment", "two-resource"): 0.9, ("split", "on"): 0.95}
    judge, asked = _judge(NOTHING_FITS, deployed)
    d = _decisions(entrain_variant(base, REQ, cost, judge))
    assert d["assignment"].chosen == "two-resource"
    ms = d["assignment"].candidates
    assert ms["two-resource"] / ms["paper"] == pytest.approx(0.9) and ms["auto"] == ms["paper"] < INF
    assert d["split"].chosen == "on"
    assert d["split"].candidates["on"] / d["split"].candidates["off"] == pytest.approx(0.95)
    assert any(set(a) == {"paper", "two-resource", "auto"} for a in asked)


def test_a_decision_with_a_fitting_candidate_is_decided_on_the_plain_check():
    """One assignment candidate fits on the plain check: it is taken there, and the deployed check
    (which would rank ``two-resource`` first) is not asked for the assignment."""
    cost, base = _base()
    plain = {**NOTHING_FITS, ("assignment", "auto"): 0.95}
    judge, asked = _judge(plain, {("assignment", "two-resource"): 0.5})
    d = _decisions(entrain_variant(base, REQ, cost, judge))
    assert d["assignment"].chosen == "auto"
    assert d["assignment"].candidates["two-resource"] == INF
    assert not any("two-resource" in a for a in asked)
