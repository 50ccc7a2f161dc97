"""The InternVL family's plain numbers and processing rules against transformers' own code: tiles per
image (``GotOcr2ImageProcessorPil``), pixel values and prompt ids (``InternVLProcessor``), parameter
counts of the cost specs (``InternVLForConditionalGeneration``), stage outputs (logits of the whole
model), the config reader's refusals, and the ``internvl35-8b`` preset through ``entrain plan``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import InternVLProcessor

from entrain.core.errors import ConfigError
from entrain.core.workload.samples import SampleMeta
from entrain.models.families.base import ModelSource
from entrain.models.families.internvl.model import rows_to_tiles
from entrain.models.families.internvl.processing import InternVLRules, image_tiles
from entrain.models.families.registry import family_of_preset, family_of_source
from tests.models.internvl_tiny import PATCH_PX, save_internvl


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def folder(request, tmp_path_factory) -> str:
    return str(save_internvl(tmp_path_factory.mktemp("internvl") / request.param, text=request.param))


def _family(folder: str):
    source = ModelSource(model_path=folder)
    family = family_of_source(source)
    cfg, tokenizer = family.runtime_config(source)
    return family, cfg, tokenizer


@pytest.mark.parametrize("limits", [(1, 12), (1, 4), (2, 6), (1, 1)])
def test_tiles_per_image_are_the_image_processors(limits):
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    lo, hi = limits
    proc = GotOcr2ImageProcessorPil(size={"height": 448, "width": 448}, min_patches=lo, max_patches=hi)
    rules = InternVLRules(min_tiles=lo, max_tiles=hi)
    sizes = [(h, w) for h in range(30, 2400, 173) for w in range(30, 2400, 191)] + [(448, 896), (224, 224)]
    for h, w in sizes:
        want = proc.get_number_of_image_patches(h, w, {"crop_to_patches": True})
        assert image_tiles(h, w, rules) == want, (h, w, limits)


def _images():
    from PIL import Image

    rng = np.random.default_rng(0)
    return [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((40, 130), (70, 60))
    ]


class _Processor(InternVLProcessor):
    """transformers' processor without a video processor (that one needs torchvision)."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name != "video_processor":
            return super().check_argument_for_proper_class(argument_name, argument)
        return None


def test_pixels_and_prompt_ids_are_internvl_processors(folder):
    """Our pixel rows (back to tiles) and ``format_chat``'s ids equal ``InternVLProcessor``'s on the
    same images and conversation; labels cover the assistant text only."""
    from transformers import AutoTokenizer
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    family, cfg, tokenizer = _family(folder)
    images = _images()
    rows, grids = family.process_images(cfg, images, family.image_rule(cfg.shape, None, None))
    meta = SampleMeta("a", tuple((im.height, im.width) for im in images), 10)
    assert [tuple(g) for g in grids.tolist()] == list(family.image_grids(cfg, meta))
    assert [g[0] for g in grids.tolist()] == [4, 1]  # a 3x1 grid and its thumbnail; one tile
    hf_tok = AutoTokenizer.from_pretrained(folder)
    turns = [("user", "<image>\nWhat is shown? <image>"), ("assistant", "A cat on a mat.")]
    text = hf_tok.apply_chat_template(
        [{"role": r, "content": t.replace("<image>", "<IMG_CONTEXT>")} for r, t in turns], tokenize=False
    )
    proc = _Processor(image_processor=GotOcr2ImageProcessorPil.from_pretrained(folder), tokenizer=hf_tok,
                      video_processor=None, image_seq_length=16)  # fmt: skip
    want = proc(images=images, text=[text], return_tensors="pt")
    tiles = rows_to_tiles(torch.from_numpy(rows), int(grids[:, 0].sum()), 3, PATCH_PX)
    assert torch.equal(tiles, want["pixel_values"].float())
    counts = [family.image_feature_rows(cfg, tuple(g)) for g in grids.tolist()]
    ids, labels = family.format_chat(cfg, turns, counts, tokenizer)
    assert ids == want["input_ids"][0].tolist()
    answer = hf_tok.encode("A cat on a mat.</s>", add_special_tokens=False)
    assert [x for x in labels if x != -100] == answer


def test_stages_give_transformers_logits(folder):
    """One encoder and one LLM stage (up to lm_head) on two packed samples of 3 and 1 + 3 tiles: the
    logits at the label positions are the whole model's, every sample alone."""
    from entrain.runtime.data import SampleRenderer

    family, cfg, _ = _family(folder)
    rule = family.image_rule(cfg.shape, None, None)
    metas = {"a": SampleMeta("a", ((60, 130),), 40, vision=rule),
             "b": SampleMeta("b", ((50, 50), (100, 60)), 30, vision=rule)}  # fmt: skip
    renderer = SampleRenderer(cfg, metas, seed=0)
    model = family.build_model(cfg)
    n_enc, n_llm = (len(family.layer_names(cfg.shape, c)) for c in ("encoder", "llm"))
    enc, llm = family.build_stage(model, "encoder", 0, n_enc), family.build_stage(model, "llm", 0, n_llm - 1)
    got = llm(enc(renderer.encoder_input(["a", "b"]).patches, renderer.grid_thw(["a", "b"])),
              renderer.llm_batch(["a", "b"], 1.0))  # fmt: skip
    want = []
    for sid in ("a", "b"):
        s = renderer.sample(sid)
        pixels = rows_to_tiles(renderer.patches(sid), sum(g[0] for g in s.grid_thw), 3, PATCH_PX)
        with torch.no_grad():
            want.append(
                model.hf(input_ids=s.input_ids[None], pixel_values=pixels).logits[0, s.label_positions]
            )
    want = torch.cat(want)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
    assert [renderer.sample(i).grid_thw for i in "ab"] == [((3, 8, 8),), ((1, 8, 8), (3, 8, 8))]


def test_cost_specs_count_every_parameter(folder):
    """The layer specs' parameter counts add up to transformers' model (untied: lm_head counted)."""
    from transformers import InternVLForConditionalGeneration

    family, cfg, _ = _family(folder)
    specs = cfg.shape.layer_specs()
    model = InternVLForConditionalGeneration.from_pretrained(folder)
    total = sum(p.numel() for p in model.parameters()) + model.lm_head.weight.numel()  # tied in the folder
    assert sum(s.param_count for c in specs.values() for s in c) == total == cfg.shape.num_params()
    assert [len(specs[c]) for c in specs] == [len(family.layer_names(cfg.shape, c)) for c in specs]


def _edit(folder: str, tmp_path: Path, file: str, **fields) -> str:
    out = tmp_path / "edited"
    shutil.copytree(folder, out)
    data = json.loads((out / file).read_text())
    data.update(fields)
    (out / file).write_text(json.dumps(data))
    return str(out)


@pytest.mark.parametrize(
    ("file", "fields", "message"),
    [
        ("config.json", {"vision_feature_layer": -2}, "vision_feature_layer"),
        ("config.json", {"vision_feature_select_strategy": "full"}, "vision_feature_select_strategy"),
        ("config.json", {"image_seq_length": 64}, "image_seq_length 64"),
        (
            "preprocessor_config.json",
            {"size": {"height": 112, "width": 112}},
            "preprocessor_config.json size",
        ),
    ],
)
def test_configs_the_stages_cannot_reproduce_are_refused(folder, tmp_path, file, fields, message):
    if "qwen3" not in folder:
        pytest.skip("one checkpoint is enough")
    edited = _edit(folder, tmp_path, file, **fields)
    with pytest.raises(ConfigError, match=message) as err:
        family_of_source(ModelSource(model_path=edited)).shape(ModelSource(model_path=edited))
    assert "config.json" in str(err.value)


def test_the_preset_is_internvl35_8b_and_plans(tmp_path, capsys):
    from entrain.cli.main import main

    shape = family_of_preset("internvl35-8b").shape(ModelSource(preset="internvl35-8b"))
    v, llm, rules = shape.vision, shape.llm, shape.rules
    assert (v.num_layers, v.hidden_size, v.num_heads, v.intermediate_size, v.patch_size, v.image_size) == (
        24, 1024, 16, 4096, 14, 448)  # fmt: skip
    assert (llm.num_hidden_layers, llm.hidden_size, llm.intermediate_size, llm.num_attention_heads,
            llm.num_key_value_heads, llm.vocab_size) == (36, 4096, 12288, 32, 8, 151_936)  # fmt: skip
    assert rules.tokens_per_tile == 256 and shape.qk_norm
    assert 8.4e9 < shape.num_params() < 8.6e9  # InternVL3.5-8B: 8.5B
    out = tmp_path / "plan.json"
    argv = ["plan", "--model", "internvl35-8b", "--dataset", "synthchartnet", "--gpus", "8", "--global-batch",
            "16", "--system", "1f1b", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["model"] == "internvl35-8b"
