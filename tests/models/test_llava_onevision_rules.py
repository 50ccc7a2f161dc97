"""LLaVA-OneVision's AnyRes rules (``entrain.models.families.llava_onevision.processing``) against
transformers' own numbers: the tile count of ``image_size_to_num_patches`` / the image processor,
and the token count of ``LlavaOnevisionModel.pack_image_features`` (run on zero features) and of
``LlavaOnevisionProcessor._get_number_of_features``."""

from __future__ import annotations

import pathlib
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlavaOnevisionConfig
from transformers.models.llava_onevision.modeling_llava_onevision import (
    LlavaOnevisionModel,
    image_size_to_num_patches,
)
from transformers.models.llava_onevision.processing_llava_onevision import LlavaOnevisionProcessor

from entrain.models.families.llava_onevision import processing as R

SIZES = [(1, 1), (10, 4000), (4000, 10), (384, 384), (383, 385), (480, 640), (640, 480), (720, 1280),
         (1080, 1920), (1920, 1080), (2304, 2304), (3000, 4000), (5000, 700), (700, 5000), (333, 2999),
         (768, 1152), (1152, 768), (50, 50), (4096, 4096), (1500, 900), (1536, 1152), (1152, 1536)]  # fmt: skip


def _hf(rules: R.OneVisionRules) -> SimpleNamespace:
    vision = SimpleNamespace(image_size=rules.tile_px, patch_size=rules.patch_px)
    pins = [list(p) for p in rules.grid_pinpoints]
    return SimpleNamespace(config=SimpleNamespace(vision_config=vision, image_grid_pinpoints=pins))


def _model_tokens(rules: R.OneVisionRules, h: int, w: int, tiles: int) -> int:
    """Tokens transformers' ``pack_image_features`` makes of ``tiles`` tiles of zero features."""
    feats = [torch.zeros(tiles, rules.tokens_per_tile, 2)]
    packed, lens = LlavaOnevisionModel.pack_image_features(
        _hf(rules), feats, torch.tensor([[h, w]]), torch.zeros(2), f"anyres_max_{rules.max_tiles}"
    )
    assert packed[0].shape[0] == int(lens[0])
    return int(lens[0])


def _processor_tokens(rules: R.OneVisionRules, h: int, w: int) -> int:
    fake = SimpleNamespace(
        image_processor=SimpleNamespace(image_grid_pinpoints=[list(p) for p in rules.grid_pinpoints]),
        num_image_tokens=rules.tokens_per_tile,
        vision_aspect_ratio=f"anyres_max_{rules.max_tiles}",
    )
    fake._get_unpadded_features = lambda *a: LlavaOnevisionProcessor._get_unpadded_features(fake, *a)
    return LlavaOnevisionProcessor._get_number_of_features(fake, h, w, rules.tile_px, rules.tile_px)


def _check(rules: R.OneVisionRules, h: int, w: int) -> None:
    pins = [list(p) for p in rules.grid_pinpoints]
    tiles = R.image_tiles(h, w, rules)
    assert tiles == image_size_to_num_patches((h, w), pins, rules.tile_px)
    tokens = R.image_tokens(h, w, rules)
    assert tokens == _model_tokens(rules, h, w, tiles) == _processor_tokens(rules, h, w)
    assert R.image_tiles(h, w, rules, alone=False) == 1
    assert R.image_tokens(h, w, rules, alone=False) == _model_tokens(rules, h, w, 1)


@pytest.mark.parametrize(("h", "w"), SIZES)
def test_7b_geometry_matches_transformers(h, w):
    _check(R.OneVisionRules(), h, w)


@settings(deadline=None, max_examples=60)
@given(h=st.integers(1, 3000), w=st.integers(1, 3000), max_tiles=st.sampled_from([1, 4, 9]))
def test_tiny_geometry_matches_transformers(h, w, max_tiles):
    rules = R.OneVisionRules(tile_px=28, patch_px=7, grid_pinpoints=((28, 28), (28, 56), (56, 28), (56, 56),
                                                                     (28, 84), (84, 56)), max_tiles=max_tiles)  # fmt: skip
    _check(rules, h, w)


def test_rules_from_a_config_json_dict():
    cfg = LlavaOnevisionConfig(vision_aspect_ratio="anyres_max_4").to_dict()
    rules = R.OneVisionRules.from_config(cfg)
    assert (rules.tile_px, rules.patch_px, rules.max_tiles, rules.tokens_per_tile) == (384, 14, 4, 729)
    assert rules.grid_pinpoints == R.DEFAULT_GRID_PINPOINTS
    with pytest.raises(ValueError, match="vision_aspect_ratio"):
        R.OneVisionRules.from_config({**cfg, "vision_aspect_ratio": "pad"})


def test_sample_rules_and_video():
    rules = R.OneVisionRules()
    assert R.sample_tokens([(480, 640), (480, 640)], rules) == [730, 730]
    assert R.sample_tiles([(480, 640)], rules) == [1 + 2 * 2]
    assert R.video_tokens(8, rules) == 8 * 14 * 14 + 1


def test_processing_module_imports_without_torch_or_transformers():
    """The rules the planner uses import with torch and transformers blocked (the image processor
    imports transformers only when it is built)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for m in ('torch', 'transformers'):\n"
        "    sys.modules[m] = None\n"
        f"import {R.__name__} as R\n"
        "assert R.image_tokens(500, 300, R.OneVisionRules()) > 0\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=pathlib.Path(R.__file__).parents[4]
    )
    assert out.returncode == 0, out.stderr[-2000:]


def test_sample_meta_counts_a_multi_image_sample_with_the_whole_sample_rule():
    """SampleMeta asks the rule's sample_image_tokens / sample_encoder_units: one tile (+ newline) per
    image of several, AnyRes for a lone image (the per-image rule alone over-counts the former)."""
    from entrain.core.workload.samples import SampleMeta

    rules = R.OneVisionRules()
    rule = R.OneVisionImageRule(rules)
    sizes = ((900, 400), (300, 1200))
    several = SampleMeta("s", sizes, 10, vision=rule)
    assert several.image_tokens_per_image == (rules.tokens_per_tile + 1,) * 2
    assert several.vit_patches_per_image == (rules.tokens_per_tile,) * 2
    alone = SampleMeta("a", sizes[:1], 10, vision=rule)
    assert alone.image_tokens_per_image == (R.image_tokens(900, 400, rules),)
    assert alone.vit_patches == rules.tokens_per_tile * R.image_tiles(900, 400, rules) > rules.tokens_per_tile
