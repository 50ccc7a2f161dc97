"""The model-family registry: lookups, a clear one-line error naming the supported families, the
Protocol's contract (every method documented, the built-in family conforms), and the plain-number
half of a family usable with torch blocked (``plan`` and ``simulate`` run without torch)."""

from __future__ import annotations

import inspect
import json
import pathlib
import subprocess
import sys

import pytest

from entrain.core.errors import ConfigError
from entrain.models.families.base import FamilyBase, ModelFamily, ModelSource
from entrain.models.families.registry import (
    family_names,
    family_of_folder,
    family_of_preset,
    family_of_source,
    get_family,
    register_family,
    unregister_family,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]


class _Claims(FamilyBase):
    """A family that claims ``model_type`` ``toy_whole`` folders (nothing else is needed to look up)."""

    name = "toy_whole"
    description = "a toy whole-checkpoint family"

    def claims_config(self, config: dict) -> bool:
        return config.get("model_type") == "toy_whole"

    def preset_names(self):
        return ("toy-whole-preset",)


def _abstract(name):
    def method(self, *args, **kwargs):
        raise NotImplementedError(name)

    return method


for _m in ("shape", "runtime_config", "build_model", "build_stage", "set_trainable", "encoder_output_width",
           "recompute_modules", "fsdp_units", "image_grids", "image_feature_rows", "encoder_input_width",
           "image_rule", "token_ids", "map_token_id"):  # fmt: skip
    setattr(_Claims, _m, _abstract(_m))


@pytest.fixture
def claims():
    family = register_family(_Claims())
    yield family
    unregister_family(family.name)


def _folder(tmp_path, config: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_the_built_in_family_conforms_and_serves_the_presets():
    comp = get_family("composition")
    assert isinstance(comp, ModelFamily) and "composition" in family_names()
    assert family_of_preset("tiny") is comp
    assert family_of_source(ModelSource(preset="qwen25vl-llama3-1b")) is comp
    assert family_of_source(ModelSource(vision_model="v", llm_model="l")) is comp


def test_a_folder_picks_the_family_that_claims_its_config(claims, tmp_path):
    folder = _folder(tmp_path, {"model_type": "toy_whole", "architectures": ["ToyWhole"]})
    assert family_of_folder(folder) is claims
    assert family_of_source(ModelSource(model_path=folder)) is claims
    assert family_of_preset("toy-whole-preset") is claims


def test_an_unsupported_folder_is_one_line_naming_the_file_its_type_and_the_families(tmp_path):
    folder = _folder(tmp_path, {"model_type": "mamba", "architectures": ["MambaForCausalLM"]})
    with pytest.raises(ConfigError) as e:
        family_of_folder(folder)
    msg = str(e.value)
    assert (
        "\n" not in msg and f"{folder}/config.json" in msg and "'mamba'" in msg and "MambaForCausalLM" in msg
    )
    assert "composition (" in msg


def test_bad_lookups_and_registrations_are_clear_errors(claims):
    with pytest.raises(
        ConfigError, match=r"unknown model family 'nope'; registered: composition, (\w+, )*toy_whole"
    ):
        get_family("nope")
    with pytest.raises(ConfigError, match="unknown model preset 'nope'; choose from tiny"):
        family_of_preset("nope")
    with pytest.raises(ConfigError, match="registered already"):
        register_family(_Claims())
    clash = type("Clash", (_Claims,), {"name": "clash"})
    with pytest.raises(ConfigError, match=r"preset\(s\) \['toy-whole-preset'\] belong to 'toy_whole'"):
        register_family(clash())
    with pytest.raises(ConfigError, match="is not a ModelFamily: it lacks .*build_model"):
        register_family(object())


def test_every_protocol_method_says_what_it_returns():
    undocumented = [
        name
        for name, member in vars(ModelFamily).items()
        if inspect.isfunction(member) and not name.startswith("_") and not (member.__doc__ or "").strip()
    ]
    assert not undocumented


def test_the_plain_number_half_runs_with_torch_blocked():
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "sys.modules['transformers'] = None\n"
        "from entrain.models.families.base import ModelSource\n"
        "from entrain.models.families.registry import family_of_source\n"
        "from entrain.core.costs.presets import build_cost_model\n"
        "src = ModelSource(preset='tiny')\n"
        "fam = family_of_source(src)\n"
        "shape = fam.shape(src)\n"
        "rule = fam.image_rule(shape, None, None)\n"
        "cost = build_cost_model(shape, 'cpu-tiny')\n"
        "assert len(fam.layer_names(shape, 'llm')) == cost.llm.num_layers\n"
        "assert rule.image_tokens(448, 448) == 256\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


class _SortsFirst(_Claims):
    name = "a_toy"

    def claims_config(self, config: dict) -> bool:
        return False

    def preset_names(self):
        return ()


def test_listing_order_does_not_depend_on_registration_order():
    """``--help`` and ``data families`` list the families in one order (the composition first, then by
    name) whichever module a process imported first: a family registered last still sorts by name."""
    register_family(_SortsFirst())
    try:
        names = family_names()
    finally:
        unregister_family("a_toy")
    assert names[:2] == ("composition", "a_toy")
    assert names[1:] == tuple(sorted(names[1:]))
