"""Golden text grids of small schedules: a change to any generator's order, or to a batcher's
assignment, shows up as a diff. The test only compares: a missing or different file fails, and
``python -m tests.sim.golden_plans`` (a separate, explicit command) rewrites the files."""

from __future__ import annotations

import pathlib

import pytest

from entrain.core.ir.plan import Action
from entrain.core.ir.validate import validate_plan
from tests.sim.golden_plans import (
    GOLDEN,
    HAND_BUILT,
    REAL,
    REGENERATE,
    golden_texts,
    hand_built_plan,
    real_plan,
)


def check_golden(folder: pathlib.Path, name: str, text: str) -> None:
    path = folder / name
    assert path.exists(), f"golden file {path.name} is missing; if intended, regenerate with `{REGENERATE}`"
    assert text == path.read_text(), f"{path.name} differs from the current Plan; if intended: `{REGENERATE}`"


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return golden_texts()


@pytest.mark.parametrize("name", [f"{s}.txt" for s in HAND_BUILT] + [f"real-{s}.txt" for s in REAL])
def test_golden_file(name, texts):
    text = texts[name]
    check_golden(GOLDEN, name, text)
    # the text form round-trips action by action
    for line in text.splitlines():
        if line.startswith("rank "):
            acts = line.split(": ", 1)[1].split()
            assert [str(Action.parse(a)) for a in acts] == acts


def test_golden_plans_are_valid_and_the_real_entrain_plan_defers():
    for s in HAND_BUILT:
        validate_plan(hand_built_plan(s))
    for s in REAL:
        validate_plan(real_plan(s))
    (rep,) = real_plan("entrain").iterations[0].assignment.replicas
    assert rep.deferrals and rep.k_eff == 4


def test_every_golden_file_is_checked(texts):
    assert sorted(p.name for p in GOLDEN.glob("*.txt")) == sorted(texts)


def test_a_missing_golden_file_fails(tmp_path, texts):
    name, text = next(iter(texts.items()))
    with pytest.raises(AssertionError, match="missing"):
        check_golden(tmp_path, name, text)
    assert not (tmp_path / name).exists()  # and nothing was written
