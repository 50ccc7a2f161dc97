"""Oracle: LLaVA-OneVision's stages equal transformers' ``LlavaOnevisionForConditionalGeneration``.

A tiny random ``LlavaOnevisionConfig`` (28-px tiles at patch 7: 16 tokens per tile, grids up to 3
tiles) is written with ``save_pretrained``; transformers loads it with ``from_pretrained`` and our
stages load it from its safetensors. Each sample runs alone through transformers (its images made by
transformers' own image processor); the staged model runs them packed in one microbatch (images of
different tile counts, a two-image sample, a text-only sample). Per-sample logits and every
parameter's gradient must agree (fp32, relative 1e-5), for a one-stage and a 2+2-stage layout; a
packed microbatch gives each sample the logits it gets alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration
from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
    LlavaOnevisionImageProcessorPil,
)

from entrain.core.errors import ConfigError
from entrain.models.batch import LLMBatch
from entrain.models.families.llava_onevision import model as ov
from entrain.models.families.llava_onevision import processing as R

torch.set_num_threads(1)

IMAGE_ID, VIDEO_ID, VOCAB = 199, 198, 200
PINPOINTS = [[28, 28], [28, 56], [56, 28], [28, 84], [84, 28]]
SAMPLES = [  # (images (height, width), text tokens before, text tokens after)
    ([(40, 70)], 5, 7),
    ([], 9, 0),
    ([(30, 30), (90, 20)], 3, 4),
    ([(100, 33)], 2, 6),
    ([(20, 50)], 4, 3),
]


def _config(feature_layer: int = -1, tied: bool = False) -> LlavaOnevisionConfig:
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, image_size=28, patch_size=7, vision_use_head=False)  # fmt: skip
    text = dict(model_type="qwen2", hidden_size=48, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=VOCAB, tie_word_embeddings=tied)  # fmt: skip
    return LlavaOnevisionConfig(
        vision_config=vision, text_config=text, image_token_index=IMAGE_ID, video_token_index=VIDEO_ID,
        image_grid_pinpoints=PINPOINTS, vision_aspect_ratio="anyres_max_2", vision_feature_layer=feature_layer,
        tie_word_embeddings=tied,
    )  # fmt: skip


@pytest.fixture(scope="module", params=[-1, -2], ids=["last-layer", "second-last"])
def folder(request, tmp_path_factory):
    torch.manual_seed(3)
    path = tmp_path_factory.mktemp(f"ov{request.param}")
    model = LlavaOnevisionForConditionalGeneration(_config(request.param))
    with torch.no_grad():  # a non-zero newline and biases: a dropped or misplaced one shows
        model.model.image_newline.normal_()
    model.save_pretrained(path)
    return str(path)


def _rules() -> R.OneVisionRules:
    return R.OneVisionRules.from_config(_config().to_dict())


def _inputs(seed: int = 0) -> list[dict]:
    """Per sample: input_ids [T], pixel_values [images, tiles, 3, 28, 28], image_sizes, targets."""
    rng = np.random.default_rng(seed)
    proc = LlavaOnevisionImageProcessorPil(size={"height": 28, "width": 28}, image_grid_pinpoints=PINPOINTS)
    out = []
    for sizes, before, after in SAMPLES:
        counts = R.sample_tokens(sizes, _rules())
        ids = list(rng.integers(0, 190, before))
        for n in counts:
            ids += [IMAGE_ID] * n + list(rng.integers(0, 190, 2))
        ids += list(rng.integers(0, 190, after))
        sample = {"ids": torch.tensor(ids), "sizes": sizes}
        if sizes:
            images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
            got = proc([images], return_tensors="pt")
            sample["pixel_values"], sample["image_sizes"] = got["pixel_values"], got["image_sizes"]
            sample["batch_num_images"] = got["batch_num_images"]
        out.append(sample)
    return out


def _label_positions(ids: torch.Tensor) -> torch.Tensor:
    """Positions whose next token is text (the loss of a chat sample skips image tokens)."""
    return torch.nonzero(ids[1:] != IMAGE_ID).flatten()


def _reference(folder: str, samples: list[dict]):
    """Transformers, one sample at a time: per-sample logits at label positions and the gradients."""
    hf = LlavaOnevisionForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    scale = 1.0 / sum(len(_label_positions(s["ids"])) for s in samples)
    logits = []
    for s in samples:
        kw = {k: s[k] for k in ("pixel_values", "image_sizes", "batch_num_images") if k in s}
        full = hf(input_ids=s["ids"][None], **kw).logits[0]
        pos = _label_positions(s["ids"])
        logits.append(full[pos])
        (F.cross_entropy(full[pos], s["ids"][pos + 1], reduction="sum") * scale).backward()
    grads = {n: p.grad for n, p in hf.named_parameters() if p.grad is not None}
    return [t.detach() for t in logits], grads


def _packed(samples: list[dict]) -> tuple[ov.TileBatch | None, LLMBatch]:
    tiles, sizes, pixels, ids, pos, lens = [], [], [], [], [], []
    for s in samples:
        if s["sizes"]:
            per = R.sample_tiles(s["sizes"], _rules())
            tiles += per
            sizes += [list(x) for x in s["image_sizes"].tolist()]
            pixels += [s["pixel_values"][i, :n] for i, n in enumerate(per)]
        pos.append(_label_positions(s["ids"]) + sum(lens))
        ids.append(s["ids"])
        lens.append(len(s["ids"]))
    input_ids, label_positions = torch.cat(ids), torch.cat(pos)
    scale = 1.0 / len(label_positions)
    batch = LLMBatch(
        input_ids=input_ids,
        position_ids=torch.cat([torch.arange(n) for n in lens]),
        seq_lens=tuple(lens),
        image_positions=torch.nonzero(input_ids == IMAGE_ID).flatten(),
        label_positions=label_positions,
        targets=input_ids[label_positions + 1],
        loss_scale=scale,
    )
    images = ov.TileBatch(torch.cat(pixels), torch.tensor(sizes), tuple(tiles)) if tiles else None
    return images, batch


def _run(model: ov.OneVisionModel, layout, images, batch: LLMBatch, *, loss: bool) -> torch.Tensor:
    """``layout``: encoder and LLM cut points; stages chained in one process."""
    x = None
    for component, cuts in zip(("encoder", "llm"), layout):
        n = len(model.layer_names(component))
        bounds = [0, *cuts, n if loss or component == "encoder" else n - 1]
        if component == "encoder" and images is None:
            continue
        for a, b in zip(bounds, bounds[1:]):
            stage = ov.build_stage(model, component, a, b)
            x = stage(images.pixel_values if (component, a) == ("encoder", 0) else x, images if component ==
                      "encoder" else batch)  # fmt: skip
    return x


def _split(logits: torch.Tensor, samples: list[dict]) -> list[torch.Tensor]:
    return list(logits.split([len(_label_positions(s["ids"])) for s in samples]))


def _assert_rel(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    err = float((a - b).abs().max())
    assert err <= 1e-5 * max(float(b.abs().max()), 1e-6), f"{what}: max error {err:.3g}"


LAYOUTS = {"one-stage": ((), ()), "2+2-stage": ((2,), (3,))}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_logits_and_gradients_equal_transformers(folder, layout):
    samples = _inputs()
    want_logits, want_grads = _reference(folder, samples)
    model = ov.build_model(folder)
    images, batch = _packed(samples)
    with torch.no_grad():
        got = _split(_run(model, layout, images, batch, loss=False), samples)
    for i, (g, w) in enumerate(zip(got, want_logits)):
        _assert_rel(g, w, f"sample {i} logits")
    _run(model, layout, images, batch, loss=True).backward()
    got_grads = {n: p.grad for n, p in model.hf.named_parameters() if p.grad is not None}
    assert set(got_grads) == set(want_grads)
    for name, w in want_grads.items():
        _assert_rel(got_grads[name], w, name)


def test_tied_checkpoint_trains_untied_with_the_tied_gradient(tmp_path):
    """LLaVA-OneVision-0.5B ties lm_head to the embedding: the stages hold two copies (they may sit on
    different stages); their gradients sum to transformers' gradient of the shared weight."""
    torch.manual_seed(4)
    hf = LlavaOnevisionForConditionalGeneration(_config(tied=True))
    assert hf.lm_head.weight is hf.model.language_model.embed_tokens.weight
    hf.save_pretrained(tmp_path)
    samples = _inputs(seed=2)
    want_logits, want_grads = _reference(str(tmp_path), samples)
    model = ov.build_model(str(tmp_path))
    images, batch = _packed(samples)
    with torch.no_grad():
        got = _split(_run(model, ((2,), (3,)), images, batch, loss=False), samples)
    for g, w in zip(got, want_logits):
        _assert_rel(g, w, "logits")
    _run(model, ((2,), (3,)), images, batch, loss=True).backward()
    grads = {n: p.grad for n, p in model.hf.named_parameters() if p.grad is not None}
    embed = "model.language_model.embed_tokens.weight"
    _assert_rel(grads.pop(embed) + grads.pop("lm_head.weight"), want_grads.pop(embed), "tied embedding")
    for name, w in want_grads.items():
        _assert_rel(grads[name], w, name)


def test_packed_logits_equal_alone(folder):
    samples = _inputs(seed=1)
    model = ov.build_model(folder)
    with torch.no_grad():
        packed = _split(_run(model, ((2,), (3,)), *_packed(samples), loss=False), samples)
        for i, s in enumerate(samples):
            alone = _run(model, ((), ()), *_packed([s]), loss=False)
            _assert_rel(packed[i], alone, f"sample {i}")


def test_patch_rows_input_equals_tiles_input(folder):
    samples = _inputs()
    model = ov.build_model(folder)
    images, _ = _packed(samples)
    stage = ov.build_stage(model, "encoder", 0, 2)
    rows = ov.tiles_to_rows(images.pixel_values, 7)
    assert rows.shape == (sum(images.tiles_per_image) * 16, 3 * 7 * 7)
    back = ov.rows_to_tiles(rows, len(images.pixel_values), 3, 7)
    assert torch.equal(back, images.pixel_values)
    with torch.no_grad():
        assert torch.equal(stage(rows, images), stage(images.pixel_values, images))


def test_patch_rows_drop_only_what_the_patch_conv_drops():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, kernel_size=14, stride=14)
    tiles = torch.randn(2, 3, 384, 384)
    rows = ov.tiles_to_rows(tiles, 14)
    assert rows.shape == (2 * 27 * 27, 588)
    with torch.no_grad():
        torch.testing.assert_close(conv(ov.rows_to_tiles(rows, 2, 3, 14)), conv(tiles), rtol=0, atol=0)


@pytest.mark.parametrize("style", ["hub-legacy", "transformers-5"])
def test_checkpoint_key_spellings_load_the_same_tensors(folder, tmp_path, style):
    """The hub's older files name ``vision_tower.vision_model.*`` and ``language_model.model.*``; a
    checkpoint written by the model's own ``state_dict`` names ``model.vision_tower.*`` ..."""
    from safetensors.torch import load_file, save_file

    state = load_file(f"{folder}/model.safetensors")
    if style == "hub-legacy":
        renamed = {k.replace("vision_tower.", "vision_tower.vision_model.", 1): v for k, v in state.items()}
    else:
        hf = LlavaOnevisionForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
        renamed = {k: v.contiguous() for k, v in hf.state_dict().items()}
    save_file(renamed, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(open(f"{folder}/config.json").read())
    want = dict(ov.build_model(folder).hf.named_parameters())
    got = dict(ov.build_model(str(tmp_path)).hf.named_parameters())
    for name, p in got.items():
        if not p.is_meta:
            assert torch.equal(p, want[name]), name
    assert sum(not p.is_meta for p in got.values()) == sum(not p.is_meta for p in want.values())


def test_a_rank_reads_only_its_stages_tensors(folder):
    model = ov.build_model(folder, stages=[("llm", 3, 8)])
    llm_last = ov.build_stage(model, "llm", 3, 8)
    assert all(p.device.type == "cpu" for _, p in llm_last.owned_parameters())
    assert model.hf.model.vision_tower.embeddings.patch_embedding.weight.is_meta
    assert model.hf.model.language_model.embed_tokens.weight.is_meta


def test_tile_and_token_counts_match_the_processor_and_model(folder):
    for s in _inputs():
        if s["sizes"]:
            per = R.sample_tiles(s["sizes"], _rules())
            assert max(per) == s["pixel_values"].shape[1]
            hf_tiles = (s["pixel_values"].abs().flatten(2).sum(-1) > 0).sum(1).tolist()
            assert hf_tiles == per


def test_unsupported_configs_are_refused(tmp_path):
    cfg = _config()
    cfg.vision_feature_select_strategy = "default"
    with pytest.raises(ConfigError, match="vision_feature_select_strategy"):
        ov.OneVisionModel(cfg, meta=True)
    with pytest.raises(ConfigError, match="no config.json"):
        ov.read_config(str(tmp_path))
    # the planner reads the same rule from config.json: plan refuses what train would
    from entrain.models.families.llava_onevision.spec import shape_from_config

    with pytest.raises(ConfigError, match="c.json: vision_feature_select_strategy 'default'"):
        shape_from_config(cfg.to_dict(), "ov", "c.json")
