"""``entrain data families``: every registered family (a toy one registered here too) with its
presets and the ``model_type`` values it claims; --json validated against
entrain/schemas/data_families.json."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from entrain.cli.main import main
from entrain.models.families.registry import families, get_family, register_family, unregister_family


class _Toy(type(get_family("composition"))):
    """The composition's methods under another name, presets and ``model_type``."""

    name = "toy_listed"
    description = "a toy family the listing must show"

    def preset_names(self):
        return ("toy-listed-a", "toy-listed-b")

    def claims_config(self, config: dict) -> bool:
        return config.get("model_type") == "toy_listed"

    def model_types(self):
        return ("toy_listed",)


@pytest.fixture
def toy():
    register_family(_Toy())
    yield "toy_listed"
    unregister_family("toy_listed")


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(resources.files("entrain").joinpath("schemas/data_families.json").read_text())


def _listed(capsys) -> dict:
    assert main(["data", "families", "--json"]) == 0
    return {r["name"]: r for r in json.loads(capsys.readouterr().out)["families"]}


def test_json_lists_every_registered_family_against_the_schema(capsys, schema, toy):
    assert main(["data", "families", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, schema)
    rows = {r["name"]: r for r in out["families"]}
    assert list(rows) == [f.name for f in families()]
    for f in families():
        assert rows[f.name]["presets"] == list(f.preset_names())
        assert rows[f.name]["description"] == f.description
    assert rows[toy] == {"name": toy, "description": _Toy.description,
                         "presets": ["toy-listed-a", "toy-listed-b"], "model_types": ["toy_listed"]}  # fmt: skip


def test_listed_model_types_are_the_ones_each_family_claims(capsys):
    rows = _listed(capsys)
    assert "qwen25vl-7b" in rows["qwen2_vl"]["presets"]
    assert set(rows["qwen2_vl"]["model_types"]) == {"qwen2_vl", "qwen2_5_vl"}
    assert rows["llava_onevision"]["model_types"] == ["llava_onevision"]
    for f in families():
        for t in rows[f.name]["model_types"]:
            assert f.claims_config({"model_type": t}), (f.name, t)
            assert [g.name for g in families() if g.claims_config({"model_type": t})] == [f.name]


def test_text_names_each_family_and_its_presets(capsys, toy):
    assert main(["data", "families"]) == 0
    text = capsys.readouterr().out
    for f in families():
        assert f"{f.name}: {f.description}" in text
    assert "toy-listed-a, toy-listed-b" in text and "model_type (--model-path): toy_listed" in text
