"""The seam's base class speaks for no model: ``FamilyBase`` has no image rule, special tokens or token
mapping (a family that forgets one is refused at registration, naming it and the member), and its
chat-template and image-processor defaults are errors naming the family and the member, never another
family's behaviour. Every registered family says all five itself."""

from __future__ import annotations

import pathlib

import pytest

from entrain.core.errors import ConfigError
from entrain.models.families.base import FamilyBase
from entrain.models.families.registry import families, register_family
from tests.models.test_family_seam import _code_tokens

BASE = pathlib.Path(__file__).resolve().parents[2] / "entrain" / "models" / "families" / "base.py"

SAMPLE_MEMBERS = ("image_rule", "token_ids", "map_token_id", "format_chat", "process_images")
"""What a sample becomes: each family's own (no default of ``FamilyBase`` stands in)."""
REQUIRED = ("image_rule", "map_token_id", "token_ids")
"""Members ``FamilyBase`` has no default for at all."""


class _Forgetful(FamilyBase):
    """Everything a ``ModelFamily`` needs but ``REQUIRED``."""

    name = "forgetful"
    description = "a family that forgot its tokens and image rule"


for _m in ("shape", "runtime_config", "build_model", "build_stage", "set_trainable", "encoder_output_width",
           "recompute_modules", "fsdp_units", "image_grids", "image_feature_rows", "encoder_input_width"):  # fmt: skip
    setattr(_Forgetful, _m, lambda self, *a, **k: None)


def test_a_family_without_its_tokens_or_image_rule_is_refused_naming_both():
    with pytest.raises(ConfigError) as e:
        register_family(_Forgetful())
    msg = str(e.value)
    assert "'forgetful' (_Forgetful)" in msg and "image_rule, map_token_id, token_ids" in msg


def test_the_base_has_no_default_for_what_a_sample_becomes():
    assert not [m for m in REQUIRED if hasattr(FamilyBase, m)]
    family = _Forgetful()
    with pytest.raises(ConfigError, match=r"'forgetful' \(_Forgetful\) implements no format_chat"):
        family.format_chat(None, [("user", "hi")], [], None)
    with pytest.raises(ConfigError, match=r"'forgetful' \(_Forgetful\) implements no process_images"):
        family.process_images(None, [], None)
    assert family.image_processing(None) is None


def test_the_base_names_no_family_and_no_special_token():
    names = {n for f in families() for n in f.code_names()} | {"<|", "Qwen", "qwen"}
    found = [
        f"{line}: {text}" for line, text in _code_tokens(BASE.read_text()) if any(n in text for n in names)
    ]
    assert not found, f"families/base.py code speaks for a model: {found}"


@pytest.mark.parametrize("family", families(), ids=lambda f: f.name)
def test_every_family_says_its_own_tokens_chat_and_image_processor(family):
    inherited = [m for m in SAMPLE_MEMBERS if getattr(type(family), m) is getattr(FamilyBase, m, None)]
    assert not inherited, f"{family.name}: takes {inherited} from FamilyBase"
