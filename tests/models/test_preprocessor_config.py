"""A checkpoint's ``preprocessor_config.json`` is what the model sees in training: the Qwen families
(whole Qwen2-VL / Qwen2.5-VL folders and a composition's stock vision folder) normalise, rescale and
resample as the folder's processor does (the pixel values equal those of transformers' own
``Qwen2VLImageProcessor`` built from the same folder, with non-default mean and std), and a field the
training processor cannot honour (another patch geometry than the vision tower's, no resizing) is a
one-line error naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from entrain.core.errors import ConfigError
from entrain.models.families.base import ModelSource
from entrain.models.families.registry import family_of_source
from tests.models.qwen_vl_tiny import save_with_tokenizer

SETTINGS = {"image_mean": [0.5, 0.25, 0.125], "image_std": [0.2, 0.3, 0.4], "rescale_factor": 1 / 200,
            "resample": 2, "min_pixels": 4 * 28 * 28, "max_pixels": 40 * 28 * 28}  # fmt: skip


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def folder(request, tmp_path_factory) -> Path:
    out = save_with_tokenizer(
        tmp_path_factory.mktemp(request.param), request.param, text_layers=1, vision_depth=1, tied=True
    )
    proc = json.loads((out / "preprocessor_config.json").read_text())
    (out / "preprocessor_config.json").write_text(json.dumps({**proc, **SETTINGS}))
    return out


def _images() -> list:
    rng = np.random.default_rng(0)
    return [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((70, 90), (150, 40))
    ]


def test_pixel_values_equal_the_folders_own_processor(folder):
    from transformers import Qwen2VLImageProcessor

    source = ModelSource(model_path=str(folder))
    family = family_of_source(source)
    shape = family.shape(source)
    cfg, _ = family.runtime_config(source)
    rule = family.image_rule(shape, None, None)
    assert (rule.min_pixels, rule.max_pixels) == (SETTINGS["min_pixels"], SETTINGS["max_pixels"])
    pixels, grids = family.process_images(cfg, _images(), rule)
    oracle = Qwen2VLImageProcessor.from_pretrained(folder)(images=_images(), return_tensors="np")
    np.testing.assert_array_equal(grids, oracle["image_grid_thw"])
    np.testing.assert_allclose(pixels, oracle["pixel_values"], rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("patch_size", 16, "patch_size 16 differs from the vision tower's 14"),
        ("merge_size", 3, "merge_size 3 differs from the vision tower's 2"),
        ("temporal_patch_size", 1, "temporal_patch_size 1 differs from the vision tower's 2"),
        ("do_resize", False, "do_resize False is not supported"),
    ],
)
def test_a_value_it_cannot_honour_is_one_line(folder, tmp_path, field, value, expected):
    import shutil

    other = Path(shutil.copytree(folder, tmp_path / "ckpt"))
    proc = json.loads((other / "preprocessor_config.json").read_text())
    (other / "preprocessor_config.json").write_text(json.dumps({**proc, field: value}))
    source = ModelSource(model_path=str(other))
    with pytest.raises(ConfigError) as err:
        family_of_source(source).shape(source)
    message = str(err.value)
    assert "\n" not in message and f"{other / 'preprocessor_config.json'}: {expected}" in message


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> Path:
    """A tiny LLaVA-OneVision checkpoint (28-px tiles) whose processor normalises with its own mean/std."""
    import torch
    from transformers import LlavaOnevisionForConditionalGeneration
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    from tests.models.test_llava_onevision import PINPOINTS, _config

    out = tmp_path_factory.mktemp("ov")
    torch.manual_seed(0)
    LlavaOnevisionForConditionalGeneration(_config()).save_pretrained(out)
    LlavaOnevisionImageProcessorPil(size={"height": 28, "width": 28}, image_grid_pinpoints=PINPOINTS,
                                    image_mean=SETTINGS["image_mean"], image_std=SETTINGS["image_std"],
                                    resample=2).save_pretrained(out)  # fmt: skip
    return out


def test_llava_pixel_values_equal_the_folders_own_processor(llava):
    from transformers import LlavaOnevisionImageProcessor

    source = ModelSource(model_path=str(llava))
    family = family_of_source(source)
    cfg, _ = family.runtime_config(source)
    rule = family.image_rule(family.shape(source), None, None)
    for image in _images():  # one image alone: all its tiles (patch rows: the tiles' values, reordered)
        rows, grids = family.process_images(cfg, [image], rule)
        oracle = LlavaOnevisionImageProcessor.from_pretrained(llava)(images=[image], return_tensors="np")
        tiles = oracle["pixel_values"][0][: grids[0, 0]]
        np.testing.assert_allclose(np.sort(rows, axis=None), np.sort(tiles, axis=None), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"size": {"height": 56, "width": 56}}, "differs from the config's 28-px tiles"),
        ({"image_grid_pinpoints": [[28, 28]]}, "image_grid_pinpoints differ from config.json's"),
        ({"do_resize": False}, "do_resize False is not supported"),
    ],
)
def test_a_llava_processor_tiling_otherwise_is_one_line(llava, tmp_path, edit, expected):
    import shutil

    other = Path(shutil.copytree(llava, tmp_path / "ckpt"))
    proc = json.loads((other / "preprocessor_config.json").read_text())
    (other / "preprocessor_config.json").write_text(json.dumps({**proc, **edit}))
    source = ModelSource(model_path=str(other))
    with pytest.raises(ConfigError, match=expected) as err:
        family_of_source(source).shape(source)
    assert "\n" not in str(err.value) and str(other / "preprocessor_config.json") in str(err.value)
