"""Close calls (``planning.extensions.CLOSE_CALLS``: the ramp and the split backward's order): where
the judge's plain memory check finds a candidate faster than the default but not past the margin, the
decision is taken again on the memory check a command deploys with (``judge.deployed``); a clear
decision, or one where no candidate is faster, never asks it."""

from __future__ import annotations

import pytest

from entrain.core.planning.extensions import CLOSE_CALLS
from entrain.core.planning.setups import entrain_variant
from tests.sim.test_decisions import REQ, _base, _decisions, fake_judge

SHARED = {("layout", "shared"): 0.9, ("split", "on"): 0.9}
"""The boundary-sharing layout with split backwards: a rank holds two stages, both orders listed."""


def _judge(plain: dict, deployed: dict | None):
    judge, _ = fake_judge(plain)
    asked: list[tuple[str, ...]] = []
    if deployed is not None:
        again, _ = fake_judge(deployed)

        def on_deploy(candidates):
            asked.append(tuple(candidates))
            return again(candidates)

        judge.deployed = on_deploy
    return judge, asked


@pytest.mark.parametrize(
    "name, option, plain, deployed, chosen",
    [
        ("ramp", ("ramp", "auto"), 0.999, 0.95, "auto"),  # close: the deployed check decides
        ("ramp", ("ramp", "auto"), 0.999, 0.999, "0"),  # close, and still within the margin there
        ("backward_order", ("backward_order", "per-b"), 0.999, 0.95, "per-b"),
        ("backward_order", ("backward_order", "per-b"), 0.999, 1.05, "slot"),
    ],
)
def test_a_close_call_is_decided_on_the_deployed_check(name, option, plain, deployed, chosen):
    cost, base = _base()
    judge, asked = _judge({**SHARED, option: plain}, {**SHARED, option: deployed})
    d = _decisions(entrain_variant(base, REQ, cost, judge))[name]
    assert name in CLOSE_CALLS
    assert d.chosen == chosen
    other = option[1]
    assert d.candidates[other] / d.candidates[d.default] == pytest.approx(deployed)  # the deciding times
    assert any(set(a) == set(d.candidates) for a in asked)


@pytest.mark.parametrize("plain", [1.001, 1.0, 0.99])
def test_no_close_call_never_asks_the_deployed_check(plain):
    """Slower or equal (nothing leans away from the default), or past the margin (0.99: taken at
    once): the deployed check is not asked, and the plain times decide."""
    cost, base = _base()
    judge, asked = _judge({**SHARED, ("ramp", "auto"): plain}, {**SHARED, ("ramp", "auto"): 0.5})
    d = _decisions(entrain_variant(base, REQ, cost, judge))["ramp"]
    assert not any("auto" in a for a in asked)
    assert d.chosen == ("auto" if plain < 0.99 + 1e-9 else "0")
    assert d.candidates["auto"] / d.candidates["0"] == pytest.approx(plain)


def test_without_a_deployed_check_the_plain_one_decides():
    cost, base = _base()
    judge, _ = _judge({**SHARED, ("ramp", "auto"): 0.999}, None)
    assert _decisions(entrain_variant(base, REQ, cost, judge))["ramp"].chosen == "0"


@pytest.mark.parametrize("deployed, chosen", [(1.05, "disjoint"), (0.9, "shared")])
def test_the_layout_is_decided_on_the_deployed_check(deployed, chosen):
    """The layouts hold different activations, so the recomputation each needs differs: the plain
    check (the planner's recomputation) puts ``shared`` 10 % ahead, and the deployed check decides, its
    times recorded (chartqa / Qwen3VL-30B-A3B: plain 5.5 % for ``shared``, deployed 2.8 % for
    ``disjoint``). Planted bug: the layout decided on the plain check keeps ``shared``."""
    cost, base = _base()
    judge, asked = _judge({("layout", "shared"): 0.9}, {("layout", "shared"): deployed})
    d = _decisions(entrain_variant(base, REQ, cost, judge))["layout"]
    assert d.chosen == chosen
    assert d.candidates["shared"] / d.candidates["disjoint"] == pytest.approx(deployed)
    assert any(set(a) == set(d.candidates) for a in asked)
