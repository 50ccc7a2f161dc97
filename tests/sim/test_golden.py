"""Golden text grids of small schedules: a change to any generator's order shows up as a diff.
Regenerate with ``pytest tests/sim --update-golden`` (or ``ENTRAIN_UPDATE_GOLDEN=1``)."""

from __future__ import annotations

import pathlib

import pytest

from entrain.core.plan import Action
from entrain.core.systems import generate_plan
from entrain.core.validate import validate_plan
from tests.sim.conftest import update_golden
from tests.sim.fixtures import (
    colocated_layout,
    deferral_assignment,
    disjoint_layout,
    one_iteration,
    plain_assignment,
    raw_samples,
    toy_cost,
)

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden"

GROUPS = [["a", "b"], ["c"], ["d", "e"], ["f"], ["g", "h"]]
WORKS = {
    "a": (4, 1),
    "b": (2, 6),
    "c": (5, 1),
    "d": (3, 2),
    "e": (3, 5),
    "f": (6, 1),
    "g": (1, 1),
    "h": (1, 1),
}


def _plan(system: str):
    cost = toy_cost(enc_layers=4, llm_layers=4, act_bytes_per_token=10.0)
    samples = raw_samples({k: (float(e), float(w)) for k, (e, w) in WORKS.items()})
    if system.startswith("dip"):
        layout = colocated_layout(2, k=5)
        asg = one_iteration(plain_assignment(GROUPS))
        options = {"dip_encoder_cap_patches": 0.4, "dip_llm_cap_tokens": 0.4}
    else:
        layout = disjoint_layout(2, 2, k=5)
        deferred = {"b": (0, 1), "e": (2, 3)} if system.startswith("entrain") else {}
        asg = one_iteration(deferral_assignment(GROUPS, deferred))
        options = {}
    return generate_plan(system, layout, asg, samples, cost, options)


def _grid(plan) -> str:
    it = plan.iterations[0]
    lines = [f"# {plan.system}: one row per rank (lowered action list)"]
    lines += [f"rank {r}: " + " ".join(str(a) for a in acts) for r, acts in sorted(it.actions.items())]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("system", ["1f1b", "disttrain", "entrain", "entrain-1f1b", "dip", "dip-greedy"])
def test_golden_grid(system, request):
    plan = _plan(system)
    validate_plan(plan)
    text = _grid(plan)
    path = GOLDEN / f"{system}.txt"
    if update_golden(request.config) or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()
    # the text form round-trips action by action
    for line in text.splitlines()[1:]:
        acts = line.split(": ", 1)[1].split()
        assert [str(Action.parse(a)) for a in acts] == acts
