"""Sweep random tiny Qwen2-VL / Qwen2.5-VL / LLaVA-OneVision checkpoints through Entrain.

For each family, ``--configs`` random configurations (seeded) vary every field a user's checkpoint may
vary; each is written with ``save_pretrained`` (random weights) and checked:

* **oracle**: the staged model's per-sample logits and every parameter's gradient equal transformers'
  ``...ForConditionalGeneration`` on a packed batch mixing image sizes, several images and text-only
  samples (fp32, relative 1e-5), for a one-stage and a 2+2-stage layout. A configuration Entrain
  refuses must be refused with a ConfigError naming ``config.json`` (a pass if transformers itself
  cannot run it either, or if the refusal is a documented limit).
* **cli** (the first ``--cli`` configurations per family; slow): ``data check`` / ``data stats``
  ``--model-path``, ``plan --model-path --out``, ``simulate``, ``train --plan --nproc 2`` for 2 steps,
  and ``export``, whose folder loads with ``from_pretrained`` and gives the logits
  of Entrain's stages built from it.

Prints a table config -> pass/fail (first error line) and writes
``benchmarks/results/family_config_sweep.md``. Run from the repository root::

    python benchmarks/family_config_sweep.py --configs 12 --cli 2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers

from entrain.core.errors import ConfigError
from entrain.models.batch import LLMBatch

ROOT = Path(__file__).resolve().parents[1]

RTOL = 1e-5
QWEN = ("qwen2_vl", "qwen2_5_vl")


@dataclass
class Case:
    family: str
    index: int
    summary: str
    config: object
    legacy: bool = False
    """Written as the published Qwen2-VL / Qwen2.5-VL folders are (transformers 4): a flat config with
    ``rope_scaling`` {type: mrope}, tensors named ``model.layers.*`` / ``visual.*``."""
    results: dict = field(default_factory=dict)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ------------------------------------------------------------------------------------------------
# Qwen2-VL / Qwen2.5-VL configurations


def _divisors(n: int, lo: int = 1) -> list[int]:
    return [d for d in range(lo, n + 1) if n % d == 0]


def _mrope_section(rng: random.Random, half: int) -> list[int]:
    """Three positive parts summing to ``half`` (temporal, height, width)."""
    a = rng.randint(1, half - 2)
    b = rng.randint(1, half - a - 1)
    return [a, b, half - a - b]


def _special_ids(rng: random.Random, vocab: int) -> dict[str, int]:
    low = rng.random() < 0.3  # sometimes well inside the vocabulary, not at its end
    start = rng.randint(10, vocab // 2) if low else vocab - rng.randint(4, 12)
    ids = rng.sample(range(start, start + 4), 4)
    keys = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return dict(zip(keys, ids))


def _qwen_text(rng: random.Random) -> tuple[dict, str]:
    heads = rng.choice([1, 2, 3, 4, 6])
    head_dim = rng.choice([8, 12, 16, 20])
    hidden = heads * head_dim
    kv = rng.choice(sorted({1, 2, heads} & set(_divisors(heads))))
    vocab = rng.randint(300, 520)
    rope = {"rope_type": "default", "rope_theta": rng.choice([10000.0, 1e6, 5e5])}
    rope["mrope_section"] = _mrope_section(rng, head_dim // 2)
    text = dict(hidden_size=hidden, intermediate_size=rng.choice([hidden, 2 * hidden + 8, 3 * hidden]),
                num_hidden_layers=rng.randint(2, 4), num_attention_heads=heads, num_key_value_heads=kv,
                vocab_size=vocab, rope_parameters=rope, hidden_act=rng.choice(["silu", "gelu", "relu"]),
                rms_norm_eps=rng.choice([1e-6, 1e-5]), max_position_embeddings=rng.choice([512, 2048, 32768]),
                use_sliding_window=False, bos_token_id=0, eos_token_id=1)  # fmt: skip
    draw = rng.random()
    if draw < 0.35:  # written out; now and then not hidden / heads (transformers' attention ignores it)
        text["head_dim"] = head_dim if draw < 0.3 else 2 * head_dim
    if rng.random() < 0.1:  # sliding-window layers from the first on, windows shorter than a sample
        text.update(use_sliding_window=True, sliding_window=8, max_window_layers=0)
    desc = f"text h{hidden} heads{heads}/kv{kv} hd{text.get('head_dim', head_dim)} mrope{rope['mrope_section']} L{text['num_hidden_layers']}"
    desc += " sliding8" if text["use_sliding_window"] else ""
    return text, desc


def _qwen_vision(rng: random.Random, family: str, out_hidden: int) -> tuple[dict, str]:
    heads = rng.choice([1, 2, 4])
    width = heads * rng.choice([8, 12, 16])
    patch = rng.choice([14, 14, 16, 8])
    merge = rng.choice([2, 2, 1, 3])
    common = dict(depth=rng.randint(1, 4), num_heads=heads, patch_size=patch, spatial_merge_size=merge,
                  temporal_patch_size=rng.choice([2, 2, 1]))  # fmt: skip
    if family == "qwen2_vl":
        vision = dict(common, embed_dim=width, hidden_size=out_hidden, mlp_ratio=rng.choice([2, 4, 3]),
                      hidden_act=rng.choice(["quick_gelu", "gelu", "silu"]))  # fmt: skip
    else:
        depth = common["depth"]
        subset = sorted(rng.sample(range(depth), rng.randint(1, depth)))
        full = rng.choice([[], list(range(depth)), subset, [*subset, depth + 3], None])  # None: the default
        window = patch * merge * rng.choice([1, 2, 4]) + rng.choice([0, 0, patch, 5])  # some not whole tokens
        vision = dict(common, hidden_size=width, intermediate_size=rng.choice([2 * width, 3 * width + 4]),
                      out_hidden_size=out_hidden, fullatt_block_indexes=full, window_size=window,
                      hidden_act=rng.choice(["silu", "gelu"]))  # fmt: skip
        if full is None:
            del vision["fullatt_block_indexes"]
    desc = f"vis d{common['depth']} w{width} heads{heads} p{patch} m{merge} tp{common['temporal_patch_size']}"
    if family == "qwen2_5_vl":
        desc += f" win{vision['window_size']} full{vision.get('fullatt_block_indexes', 'default')}"
    return vision, desc


def qwen_case(rng: random.Random, family: str, index: int) -> Case:
    text, tdesc = _qwen_text(rng)
    vision, vdesc = _qwen_vision(rng, family, text["hidden_size"])
    ids = _special_ids(rng, text["vocab_size"])
    tied = rng.random() < 0.5
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig as Cls
    else:
        from transformers import Qwen2_5_VLConfig as Cls
    cfg = Cls(vision_config=vision, text_config=dict(text, tie_word_embeddings=tied),
              tie_word_embeddings=tied, **ids)  # fmt: skip
    legacy = rng.random() < 0.35
    summary = f"{tdesc}; {vdesc}; tied={tied} ids={ids['image_token_id']}/{ids['vision_start_token_id']}"
    return Case(family, index, summary + (" legacy-layout" if legacy else ""), cfg, legacy=legacy)


# --- Qwen oracle -----------------------------------------------------------------------------------


def _text_ids(cfg, vocab: int) -> list[int]:
    special = {cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id}
    return [i for i in range(2, vocab) if i not in special]


@dataclass(frozen=True)
class Sample:
    """One oracle sample: ``PackedSample``'s fields (``entrain.models.families.base``), its images'
    patches in order, and every next token as a label."""

    input_ids: torch.Tensor
    image_positions: torch.Tensor
    grids: tuple[tuple[int, int, int], ...]
    patches: torch.Tensor
    label_positions = property(lambda self: torch.arange(self.input_ids.numel() - 1))
    targets = property(lambda self: self.input_ids[1:])


def hf_logits(hf, s: Sample) -> torch.Tensor:
    """Transformers' own forward of the sample alone, the oracle: ``[L, V]`` logits."""
    hf.model.rope_deltas = None
    image_tokens = torch.isin(torch.arange(s.input_ids.numel()), s.image_positions)
    images = {"pixel_values": s.patches, "image_grid_thw": torch.tensor(s.grids)} if s.grids else {}
    return hf(
        input_ids=s.input_ids[None], mm_token_type_ids=image_tokens.to(torch.int32)[None], **images
    ).logits[0]


def qwen_samples(cfg, seed: int) -> list[Sample]:
    """Two images of different sizes, text only, a wide image, a small image (grids in merge units)."""
    v, vocab = cfg.vision_config, cfg.get_text_config().vocab_size
    m = v.spatial_merge_size
    width = v.in_channels * v.temporal_patch_size * v.patch_size**2
    allowed = torch.tensor(_text_ids(cfg, vocab))
    gen = torch.Generator().manual_seed(seed)
    layouts = [[5, (2, 3), 3, (4, 2), 7], [11], [(3, 3), 9], [4, (1, 1), 6]]
    out = []
    for layout in layouts:
        ids, pos, grids, patches = [], [], [], []
        for part in layout:
            if isinstance(part, int):
                ids += allowed[torch.randint(0, len(allowed), (part,), generator=gen)].tolist()
                continue
            grid = (1, part[0] * m, part[1] * m)
            n = grid[1] * grid[2] // m**2
            ids.append(cfg.vision_start_token_id)
            pos += range(len(ids), len(ids) + n)
            ids += [cfg.image_token_id] * n
            ids.append(cfg.vision_end_token_id)
            grids.append(grid)
            patches.append(torch.randn(grid[1] * grid[2], width, generator=gen))
        out.append(Sample(torch.tensor(ids), torch.tensor(pos, dtype=torch.int64), tuple(grids),
                           torch.cat(patches) if patches else torch.zeros(0, width)))  # fmt: skip
    return out


def _qwen_batch(hf_config, samples, *, all_positions: bool, loss_scale: float) -> LLMBatch:
    from entrain.models.families.qwen2_vl.positions import mrope_position_ids

    offsets = np.cumsum([0] + [s.input_ids.numel() for s in samples]).tolist()
    labels = [torch.arange(s.input_ids.numel()) if all_positions else s.label_positions for s in samples]
    return LLMBatch(
        input_ids=torch.cat([s.input_ids for s in samples]),
        position_ids=mrope_position_ids(hf_config, samples),
        seq_lens=tuple(s.input_ids.numel() for s in samples),
        image_positions=torch.cat([s.image_positions + o for s, o in zip(samples, offsets)]),
        label_positions=torch.cat([p + o for p, o in zip(labels, offsets)]),
        targets=torch.zeros(0, dtype=torch.int64)
        if all_positions
        else torch.cat([s.targets for s in samples]),
        loss_scale=loss_scale,
    )


def _cuts(n: int, two: bool, loss: bool) -> list[tuple[int, int]]:
    end = n if loss else n - 1
    if not two:
        return [(0, end)]
    mid = max(1, min(end - 1, n // 2))
    return [(0, mid), (mid, end)]


def _qwen_run(qm, model, samples, two: bool, *, loss: bool, scale: float = 1.0) -> torch.Tensor:
    counts = qm.layer_counts(model)
    x = None
    grids = [g for s in samples for g in s.grids]
    if grids:
        x = torch.cat([s.patches for s in samples])
        for a, b in _cuts(counts["encoder"], two, True):
            x = qm.build_stage(model, "encoder", a, b)(x, torch.tensor(grids))
    batch = _qwen_batch(model.config, samples, all_positions=not loss, loss_scale=scale)
    for a, b in _cuts(counts["llm"], two, loss):
        x = qm.build_stage(model, "llm", a, b)(x, batch)
    return x


def qwen_oracle(folder: str, cfg) -> str:
    from entrain.models.families.qwen2_vl import model as qm

    hf = qm.conditional_generation_class(cfg.model_type).from_pretrained(folder, attn_implementation="sdpa")
    hf = hf.float().train()
    samples = qwen_samples(cfg, seed=7)
    with torch.no_grad():
        want = [hf_logits(hf, s) for s in samples]
    scale = 1.0 / sum(s.label_positions.numel() for s in samples)
    hf_loss = sum(F.cross_entropy(hf_logits(hf, s)[:-1], s.targets, reduction="sum") for s in samples)
    (hf_loss * scale).backward()
    want_grads = {n: p.grad for n, p in hf.named_parameters()}
    for two in (False, True):
        staged = qm.build_model(folder)
        with torch.no_grad():
            got = _qwen_run(qm, staged, samples, two, loss=False)
        for i, g in enumerate(got.split([s.input_ids.numel() for s in samples])):
            if rel_err(g, want[i]) >= RTOL:
                return f"{'2+2' if two else '1'}-stage: sample {i} logits differ ({rel_err(g, want[i]):.1e})"
        _qwen_run(qm, staged, samples, two, loss=True, scale=scale).backward()
        bad = _grad_mismatch(dict(staged.named_parameters()), want_grads, staged.entrain_tied_source,
                             "model.language_model.embed_tokens.weight")  # fmt: skip
        if bad:
            return f"{'2+2' if two else '1'}-stage: {bad}"
    return ""


def _grad_mismatch(got: dict, want: dict, tied: bool, embed: str) -> str:
    """The first parameter whose gradient differs: relative 1e-5 of its own norm, or of 1e-3 of the
    largest gradient norm (a key bias's gradient is 0 up to rounding: softmax ignores it)."""
    floor = 1e-3 * max(float(w.norm()) for w in want.values() if w is not None)
    for name, w in want.items():
        g = got[name].grad if name in got else None
        if tied and name == embed:
            g = g + got["lm_head.weight"].grad
        if w is None and g is None:
            continue
        if w is None or g is None:
            return f"{name}: gradient {'missing' if g is None else 'unexpected'}"
        if float((g - w).norm()) >= RTOL * max(float(w.norm()), floor):
            return f"{name}: gradient differs ({rel_err(g, w):.1e})"
    return ""


# ------------------------------------------------------------------------------------------------
# LLaVA-OneVision configurations


def ov_case(rng: random.Random, index: int) -> Case:
    from transformers import LlavaOnevisionConfig

    heads = rng.choice([1, 2, 4])
    width = heads * rng.choice([8, 12, 16])
    patch = rng.choice([4, 7, 8, 14])
    tile = patch * rng.choice([2, 3, 4]) + rng.choice([0, 0, 1, 3])  # a remainder the conv drops
    layers = rng.randint(1, 4)
    feature = rng.choice([-1, -2, 0, layers, rng.randint(1, layers), -layers - 1, [-2, -1], [0, layers]])
    strategy = "full" if rng.random() < 0.85 else "default"
    grids = sorted({(rng.randint(1, 3), rng.randint(1, 3)) for _ in range(rng.randint(1, 5))})
    pinpoints = [[tile * a, tile * b] for a, b in grids]
    t_heads = rng.choice([2, 3, 4])
    hidden = t_heads * rng.choice([8, 16])
    vocab = rng.randint(200, 400)
    image_id = rng.choice([vocab - 1, vocab - 3, rng.randint(5, vocab // 2)])
    tied = rng.random() < 0.4
    vision = dict(model_type="siglip_vision_model", hidden_size=width, intermediate_size=2 * width + 4,
                  num_hidden_layers=layers, num_attention_heads=heads, image_size=tile, patch_size=patch,
                  vision_use_head=rng.random() < 0.3)  # fmt: skip
    text = dict(model_type="qwen2", hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=rng.randint(2, 4),
                num_attention_heads=t_heads, num_key_value_heads=rng.choice(_divisors(t_heads)), vocab_size=vocab,
                tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": rng.choice([1e4, 1e6])},
                rms_norm_eps=rng.choice([1e-6, 1e-5]))  # fmt: skip
    if rng.random() < 0.25:  # Qwen2's attention takes head_dim as given
        text["head_dim"] = rng.choice([8, 16, 24])
    if rng.random() < 0.1:
        text.update(use_sliding_window=True, sliding_window=8, max_window_layers=0)
    cfg = LlavaOnevisionConfig(
        vision_config=vision, text_config=text, image_token_index=image_id, video_token_index=image_id - 1,
        image_grid_pinpoints=pinpoints, vision_aspect_ratio=f"anyres_max_{rng.choice([1, 2, 4, 9])}",
        vision_feature_layer=feature, vision_feature_select_strategy=strategy, tie_word_embeddings=tied,
        projector_hidden_act=rng.choice(["gelu", "silu", "relu", "gelu_pytorch_tanh"]),
        multimodal_projector_bias=rng.random() < 0.7, image_seq_length=rng.choice([576, (tile // patch) ** 2]),
    )  # fmt: skip
    summary = (f"siglip L{layers} w{width} tile{tile}/p{patch} feat{feature} {strategy} pins{grids} "
               f"{cfg.vision_aspect_ratio} text h{hidden} hd{text.get('head_dim', '-')} L{text['num_hidden_layers']} "
               f"sliding={text.get('use_sliding_window', False)} tied={tied} img{image_id} "
               f"act={cfg.projector_hidden_act} bias={cfg.multimodal_projector_bias}")  # fmt: skip
    return Case("llava_onevision", index, summary, cfg)


OV_SAMPLES = [([(40, 70)], 5, 7), ([], 9, 0), ([(30, 30), (90, 20)], 3, 4), ([(100, 33)], 2, 6)]


def ov_samples(cfg, seed: int) -> list[dict]:
    from PIL import Image
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    from entrain.models.families.llava_onevision import processing as R

    rules = R.OneVisionRules.from_config(cfg.to_dict())
    tile = cfg.vision_config.image_size
    proc = LlavaOnevisionImageProcessorPil(size={"height": tile, "width": tile},
                                           image_grid_pinpoints=cfg.image_grid_pinpoints)  # fmt: skip
    rng = np.random.default_rng(seed)
    allowed = np.array([i for i in range(cfg.text_config.vocab_size) if i not in (cfg.image_token_index, cfg.video_token_index)])  # fmt: skip
    out = []
    for sizes, before, after in OV_SAMPLES:
        ids = list(rng.choice(allowed, before))
        for n in R.sample_tokens(sizes, rules):
            ids += [cfg.image_token_index] * n + list(rng.choice(allowed, 2))
        ids += list(rng.choice(allowed, after))
        s = {"ids": torch.tensor(ids), "sizes": sizes, "tiles": R.sample_tiles(sizes, rules) if sizes else []}
        if sizes:
            images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
            got = proc([images], return_tensors="pt")
            s.update(pixel_values=got["pixel_values"], image_sizes=got["image_sizes"],
                     batch_num_images=got["batch_num_images"])  # fmt: skip
        out.append(s)
    return out


def _ov_labels(cfg, ids: torch.Tensor) -> torch.Tensor:
    return torch.nonzero(ids[1:] != cfg.image_token_index).flatten()


def _ov_packed(cfg, samples):
    from entrain.models.families.llava_onevision import model as ov

    tiles, sizes, pixels, ids, pos, lens = [], [], [], [], [], []
    for s in samples:
        if s["sizes"]:
            tiles += s["tiles"]
            sizes += [list(x) for x in s["image_sizes"].tolist()]
            pixels += [s["pixel_values"][i, :n] for i, n in enumerate(s["tiles"])]
        pos.append(_ov_labels(cfg, s["ids"]) + sum(lens))
        ids.append(s["ids"])
        lens.append(len(s["ids"]))
    input_ids, labels = torch.cat(ids), torch.cat(pos)
    batch = LLMBatch(input_ids=input_ids, position_ids=torch.cat([torch.arange(n) for n in lens]),
                     seq_lens=tuple(lens), image_positions=torch.nonzero(input_ids == cfg.image_token_index).flatten(),
                     label_positions=labels, targets=input_ids[labels + 1], loss_scale=1.0 / len(labels))  # fmt: skip
    images = ov.TileBatch(torch.cat(pixels), torch.tensor(sizes), tuple(tiles)) if tiles else None
    return images, batch


def _ov_run(ov, model, two: bool, images, batch, *, loss: bool) -> torch.Tensor:
    x = None
    for component in ("encoder", "llm"):
        if component == "encoder" and images is None:
            continue
        n = len(model.layer_names(component))
        for a, b in _cuts(n, two, loss or component == "encoder"):
            stage = ov.build_stage(model, component, a, b)
            first = (component, a) == ("encoder", 0)
            x = stage(images.pixel_values if first else x, images if component == "encoder" else batch)
    return x


def ov_oracle(folder: str, cfg) -> str:
    from transformers import LlavaOnevisionForConditionalGeneration

    from entrain.models.families.llava_onevision import model as ov

    hf = LlavaOnevisionForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    samples = ov_samples(cfg, seed=5)
    scale = 1.0 / sum(len(_ov_labels(cfg, s["ids"])) for s in samples)
    want = []
    for s in samples:
        kw = {k: s[k] for k in ("pixel_values", "image_sizes", "batch_num_images") if k in s}
        full = hf(input_ids=s["ids"][None], **kw).logits[0]
        pos = _ov_labels(cfg, s["ids"])
        want.append(full[pos].detach())
        (F.cross_entropy(full[pos], s["ids"][pos + 1], reduction="sum") * scale).backward()
    want_grads = {n: p.grad for n, p in hf.named_parameters()}
    images, batch = _ov_packed(cfg, samples)
    for two in (False, True):
        model = ov.build_model(folder)
        with torch.no_grad():
            got = _ov_run(ov, model, two, images, batch, loss=False)
        got = got[batch.label_positions] if got.shape[0] == batch.input_ids.numel() else got
        for i, g in enumerate(got.split([len(w) for w in want])):
            if rel_err(g, want[i]) >= RTOL:
                return f"{'2+2' if two else '1'}-stage: sample {i} logits differ ({rel_err(g, want[i]):.1e})"
        _ov_run(ov, model, two, images, batch, loss=True).backward()
        got_params = dict(model.hf.named_parameters())
        bad = _grad_mismatch(got_params, want_grads, bool(cfg.tie_word_embeddings),
                             "model.language_model.embed_tokens.weight")  # fmt: skip
        if bad:
            return f"{'2+2' if two else '1'}-stage: {bad}"
    return ""


# ------------------------------------------------------------------------------------------------
# saving, refusals, the CLI


def save_case(case: Case, folder: Path, *, tokenizer: bool) -> None:
    from transformers import AutoModelForImageTextToText

    torch.manual_seed(case.index)
    model = AutoModelForImageTextToText.from_config(case.config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(folder)
    if case.legacy:
        legacy_layout(folder)
    if tokenizer:
        save_processor_files(case, folder)


def legacy_layout(folder: Path) -> None:
    """Rewrite a transformers-5 Qwen2(.5)-VL folder as the Hub's published ones are: the text fields
    at the top level, ``rope_theta`` + ``rope_scaling`` {type: mrope, mrope_section}, ``in_chans``,
    tensors ``model.layers.*`` / ``model.embed_tokens`` / ``model.norm`` / ``visual.*``."""
    from safetensors.torch import load_file, save_file

    config = json.loads((folder / "config.json").read_text())
    text = config.pop("text_config")
    rope = text.pop("rope_parameters")
    for key in ("model_type", "architectures", "dtype"):
        text.pop(key, None)
    config.update(text)
    config["rope_theta"] = rope["rope_theta"]
    config["rope_scaling"] = {"type": "mrope", "mrope_section": rope["mrope_section"]}
    config["vision_config"]["in_chans"] = config["vision_config"].pop("in_channels", 3)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    for f in folder.glob("*.safetensors"):
        tensors = load_file(f)
        renamed = {}
        for name, t in tensors.items():
            if name.startswith("model.language_model."):
                name = "model." + name[len("model.language_model.") :]
            elif name.startswith("model.visual."):
                name = name[len("model.") :]
            renamed[name] = t
        save_file(renamed, f, metadata={"format": "pt"})
    index = folder / "model.safetensors.index.json"
    if index.exists():
        index.unlink()


def save_processor_files(case: Case, folder: Path) -> None:
    """What a published folder ships: the image processor's config (and for Qwen a tokenizer whose
    vision tokens sit at the config's ids is not made: the built-in Qwen2 tokenizer maps onto them)."""
    cfg = case.config
    if case.family in QWEN:
        v = cfg.vision_config
        proc = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": v.patch_size,
                "temporal_patch_size": v.temporal_patch_size, "merge_size": v.spatial_merge_size,
                "min_pixels": 3136, "max_pixels": 200_000}  # fmt: skip
        (folder / "preprocessor_config.json").write_text(json.dumps(proc, indent=1) + "\n")
        return
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    tile = cfg.vision_config.image_size
    LlavaOnevisionImageProcessorPil(
        size={"height": tile, "width": tile}, image_grid_pinpoints=cfg.image_grid_pinpoints
    ).save_pretrained(folder)


def check_refusal(case: Case, folder: Path) -> str | None:
    """None when Entrain accepts the folder's config at plan time; else the ConfigError's line."""
    from entrain.models.families.base import ModelSource
    from entrain.models.families.registry import family_of_folder

    try:
        family = family_of_folder(str(folder))
        family.shape(ModelSource(model_path=str(folder)))
    except ConfigError as e:
        return str(e).splitlines()[0]
    return None


def _main_quiet(argv: list[str]) -> tuple[int, str]:
    from entrain.cli.main import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
    return rc, buf.getvalue()


def run_cli(case: Case, folder: Path, work: Path) -> str:
    """data check/stats, plan, simulate, train on 2 ranks, export: '' or the first failing step."""
    m = ["--model-path", str(folder)]
    data = work / "ds"
    steps = [
        ["data", "synth", "--dataset", "chartqa", "--num-samples", "8", "--out", str(data)],
        ["data", "check", str(data / "data.json"), *m, "--json"],
        ["data", "stats", *m, "--dataset", str(data / "data.json"), "--json"],
        ["plan", *m, "--dataset", str(data / "data.json"), "--gpus", "2", "--global-batch", "4",
         "--out", str(work / "plan.json")],
        ["simulate", *m, "--dataset", str(data / "data.json"), "--gpus", "2", "--global-batch", "4",
         "--iterations", "1", "--json"],
    ]  # fmt: skip
    for argv in steps:
        rc, out = _main_quiet(argv)
        if rc != 0:
            return f"{' '.join(argv[:2])}: rc {rc}: {_first_error(out)}"
    train = ["train", *m, "--plan", str(work / "plan.json"), "--dataset", str(data / "data.json"),
             "--steps", "2", "--out", str(work / "run"), "--no-progress"]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "entrain", *train, "--nproc", "2"], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    if done.returncode != 0:
        return f"train: rc {done.returncode}: {_first_error(done.stderr + done.stdout)}"
    rc, out = _main_quiet(["export", str(work / "run"), "--out", str(work / "hf")])
    if rc != 0:
        return f"export: rc {rc}: {_first_error(out)}"
    return check_export(case, folder, work / "hf")


def _first_error(text: str) -> str:
    lines = [x for x in text.splitlines() if x.strip()]
    for x in reversed(lines):
        if "Error" in x or "error" in x:
            return x.strip()[:200]
    return (lines[-1] if lines else "").strip()[:200]


def check_export(case: Case, source: Path, hf_dir: Path) -> str:
    """The export loads with ``from_pretrained``, moved from the source, and its logits are the
    logits Entrain's stages give on it (the oracle run on the exported folder)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(hf_dir)
    before = dict(AutoModelForImageTextToText.from_pretrained(source).named_parameters())
    if all(torch.equal(p, before[n]) for n, p in model.named_parameters() if n in before):
        return "export: the weights did not move"
    cfg = model.config
    err = qwen_oracle(str(hf_dir), cfg) if case.family in QWEN else ov_oracle(str(hf_dir), cfg)
    return f"export oracle: {err}" if err else ""


# ------------------------------------------------------------------------------------------------


def run_case(case: Case, cli: bool, tmp: Path) -> None:
    if case.config is None:
        return
    folder = tmp / f"{case.family}-{case.index}"
    try:
        save_case(case, folder, tokenizer=cli)
    except Exception as e:  # noqa: BLE001 - transformers cannot build it: not a checkpoint anyone has
        case.results["oracle"] = f"skip (transformers: {str(e).splitlines()[0][:120]})"
        return
    refusal = check_refusal(case, folder)
    if refusal is not None:
        case.results["oracle"] = f"refused: {refusal[:200]}"
        return
    oracle = qwen_oracle if case.family in QWEN else ov_oracle
    case.results["oracle"] = _guarded(lambda: oracle(str(folder), case.config))
    if cli:
        case.results["cli"] = _guarded(
            lambda: run_cli(case, folder, tmp / f"work-{case.family}-{case.index}")
        )


def _guarded(fn) -> str:
    try:
        err = fn()
    except Exception as e:  # noqa: BLE001 - a crash is a failure, reported by its first line
        tb = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{Path(tb.filename).name}:{tb.lineno}"
        return f"FAIL {type(e).__name__} at {where}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return "pass" if not err else f"FAIL {err}"


def make_cases(families: list[str], n: int, seed: int) -> list[Case]:
    cases = []
    for family in families:
        rng = random.Random(f"{seed}-{family}")
        for i in range(n):
            try:
                cases.append(ov_case(rng, i) if family == "llava_onevision" else qwen_case(rng, family, i))
            except Exception as e:  # noqa: BLE001 - transformers' config validation refuses it
                cases.append(
                    Case(family, i, f"(config refused by transformers: {str(e).splitlines()[0][:100]})", None)
                )
                cases[-1].results["oracle"] = "skip"

    return cases


def write_report(cases: list[Case], path: Path, args) -> None:
    lines = [
        "# Family config sweep",
        "",
        f"`python benchmarks/family_config_sweep.py --seed {args.seed} --configs {args.configs} --cli {args.cli}`: "
        "random tiny checkpoints (save_pretrained) against transformers' own classes "
        "(oracle: per-sample logits and every gradient, fp32 rel 1e-5, 1 and 2+2 stages; cli: data check/stats, "
        "plan, simulate, 2-rank train, export -> from_pretrained).",
        "",
        "| family | # | config | oracle | cli |",
        "|---|---|---|---|---|",
    ]
    for c in cases:
        lines.append(
            f"| {c.family} | {c.index} | {c.summary} | {c.results.get('oracle', '')} | {c.results.get('cli', '-')} |"
        )
    summary = {}
    for c in cases:
        ok = all(v == "pass" or v.startswith(("refused", "skip")) for v in c.results.values())
        summary.setdefault(c.family, [0, 0])[0 if ok else 1] += 1
    lines += ["", "| family | ok | failed |", "|---|---|---|"]
    lines += [f"| {f} | {a} | {b} |" for f, (a, b) in summary.items()]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", type=int, default=12, help="configurations per family")
    p.add_argument("--cli", type=int, default=2, help="configurations per family also run through the CLI")
    p.add_argument("--families", default="qwen2_vl,qwen2_5_vl,llava_onevision")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "family_config_sweep.md"))
    args = p.parse_args()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    cases = make_cases(args.families.split(","), args.configs, args.seed)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for c in cases:
            t0 = time.perf_counter()
            run_case(c, c.index < args.cli, Path(tmp))
            c.results = {k: v.replace(tmp, "DIR") for k, v in c.results.items()}  # no machine paths
            status = " ".join(f"{k}={v}" for k, v in c.results.items())
            failed += any(v.startswith("FAIL") for v in c.results.values())
            print(
                f"{c.family:16s} {c.index:3d} {time.perf_counter() - t0:6.1f}s {status}\n    {c.summary}",
                flush=True,
            )
    write_report(cases, Path(args.out), args)
    print(f"{len(cases)} configs, {failed} failed; wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
