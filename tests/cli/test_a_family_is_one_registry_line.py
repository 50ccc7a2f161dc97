"""A new model family is one folder and one ``register_family`` line: a family built from existing parts
(a subclass of the composition serving its own preset) is, once registered and with no other edit,
listed by ``entrain data families``, planned by ``entrain plan`` and simulated by ``entrain simulate``
exactly as the family it is built from, and the tests that enumerate families (the journeys of
``tests/journeys/test_families.py``, ``tests/cli/test_plan_to_train_every_family.py``) see it and ask
for its tiny checkpoint."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from entrain.cli.main import main
from entrain.core.model.architectures import MODEL_PRESETS
from entrain.models.families.base import ModelSource
from entrain.models.families.composition.family import CompositionFamily
from entrain.models.families.registry import families, family_of_preset, register_family, unregister_family

TWIN, PRESET = "twin_composition", "twin-tiny"


class TwinFamily(CompositionFamily):
    """The composition's parts under another name and preset."""

    name = TWIN
    description = "the composition's parts under another name (a test family)"

    def preset_names(self) -> tuple[str, ...]:
        return (PRESET,)

    def code_names(self) -> tuple[str, ...]:
        return (TWIN,)

    def shape(self, source: ModelSource):
        return replace(MODEL_PRESETS["tiny"], name=PRESET)


@pytest.fixture
def twin():
    family = register_family(TwinFamily())  # the one line a new family adds
    yield family
    unregister_family(TWIN)


FLAGS = ["--dataset", "skewed", "--hardware", "cpu-tiny", "--gpus", "2", "--global-batch", "4",
         "--microbatch-size", "1", "--seed", "3", "--json"]  # fmt: skip


def _json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0, capsys.readouterr().err[-2000:]
    return json.loads(capsys.readouterr().out)


def _same_but_the_name(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True).replace(PRESET, "tiny") == json.dumps(b, sort_keys=True)


def test_a_registered_family_is_listed_planned_and_simulated(twin, capsys):
    assert family_of_preset(PRESET) is twin
    rows = _json(capsys, "data", "families", "--json")["families"]
    assert TWIN in json.dumps(rows) and PRESET in json.dumps(rows)
    plan = _json(capsys, "plan", "--model", PRESET, "--system", "1f1b", *FLAGS)
    assert _same_but_the_name(plan, _json(capsys, "plan", "--model", "tiny", "--system", "1f1b", *FLAGS))
    sim = ["--systems", "1f1b", "--iterations", "1"]
    got = _json(capsys, "simulate", "--model", PRESET, *sim, *FLAGS)
    assert _same_but_the_name(got, _json(capsys, "simulate", "--model", "tiny", *sim, *FLAGS))


def test_the_family_enumerating_tests_ask_for_its_journey(twin):
    from tests.cli.test_plan_to_train_every_family import MODELS
    from tests.journeys.test_families import CHECKPOINTS, registered

    assert (TWIN, "stock folders") in registered() and (TWIN, "stock folders") not in CHECKPOINTS
    assert TWIN in {f.name for f in families()} - {family for family, _ in MODELS.values()}
