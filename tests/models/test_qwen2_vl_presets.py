"""The ``qwen2_vl`` family's cost-model preset ``qwen25vl-7b``: Qwen2.5-VL-7B-Instruct's published
``config.json`` read by the family gives the preset's shape, and transformers'
``Qwen2_5_VLForConditionalGeneration`` built from that config on the meta device has the preset's
parameter count (8.29 B); the preset plans and simulates but does not train without its checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration

from entrain.core.errors import ConfigError
from entrain.models.families.base import ModelSource
from entrain.models.families.registry import family_of_folder, family_of_preset

PUBLISHED_7B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "bos_token_id": 151643, "eos_token_id": 151645,
    "vision_start_token_id": 151652, "vision_end_token_id": 151653, "vision_token_id": 151654,
    "image_token_id": 151655, "video_token_id": 151656,
    "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 128000,
    "max_window_layers": 28, "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False,
    "use_sliding_window": False, "vocab_size": 152064,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": {
        "depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
        "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
        "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2, "temporal_patch_size": 2,
    },
}  # fmt: skip
"""``Qwen/Qwen2.5-VL-7B-Instruct/config.json`` (the fields that set the shape)."""


@pytest.fixture(scope="module")
def published_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen25vl_7b")
    (folder / "config.json").write_text(json.dumps(PUBLISHED_7B))
    return str(folder)


def test_preset_is_the_published_config_as_the_family_reads_it(published_folder):
    family = family_of_preset("qwen25vl-7b")
    preset = family.shape(ModelSource(preset="qwen25vl-7b"))
    assert family_of_folder(published_folder) is family
    read = family.shape(ModelSource(model_path=published_folder))
    assert (preset.vision, preset.llm) == (read.vision, read.llm)


def test_preset_parameter_count_equals_transformers_on_the_meta_device(published_folder):
    family = family_of_preset("qwen25vl-7b")
    shape = family.shape(ModelSource(preset="qwen25vl-7b"))
    with torch.device("meta"):
        hf = Qwen2_5_VLForConditionalGeneration(AutoConfig.from_pretrained(published_folder))
    want = sum(p.numel() for p in hf.parameters())
    assert want == pytest.approx(8.29e9, rel=1e-3)
    assert shape.num_params() == want
    specs = shape.layer_specs()
    assert sum(s.param_count for c in specs.values() for s in c) == want
    assert [s.name for s in specs["encoder"]] == family.layer_names(shape, "encoder")
    assert [s.name for s in specs["llm"]] == family.layer_names(shape, "llm")


def test_preset_is_for_the_cost_model_only():
    family = family_of_preset("qwen25vl-7b")
    with pytest.raises(ConfigError, match="--model-path"):
        family.runtime_config(ModelSource(preset="qwen25vl-7b"))
    family.check_tp(family.shape(ModelSource(preset="qwen25vl-7b")), 2)
