"""``entrain export RUN_DIR --out DIR``: one Hugging Face-loadable checkpoint from a run's stage shards.

The newest complete checkpoint of ``RUN_DIR/checkpoints`` (every model shard verified against its
manifest; a corrupt one is passed over with a message) is assembled and written as::

    DIR/vision/   config.json + model.safetensors   Qwen2_5_VisionTransformerPretrainedModel (its
                                                    merger projects to the LLM width)
    DIR/llm/      config.json + model.safetensors   LlamaForCausalLM
    DIR/entrain_export.json                         model preset, step, source run, image token id

Load with ``Qwen2_5_VisionTransformerPretrainedModel.from_pretrained(DIR / "vision")`` and
``LlamaForCausalLM.from_pretrained(DIR / "llm")``; image features replace the LLM embeddings at the
image-pad positions. The same folder is accepted by ``entrain train --weights DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from entrain.core.errors import ConfigError

EXPORT_INFO = "entrain_export.json"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export", help="write a run's checkpoint as Hugging Face folders", description=__doc__
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a training run folder (with checkpoints/)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--step", type=int, default=None, help="export this step's checkpoint (default: newest)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def _choose(run_dir: str, step: int | None) -> tuple[dict, dict]:
    from entrain.runtime.checkpoint import checkpoint_dirs, load_model_state

    found = checkpoint_dirs(run_dir)
    steps = sorted(s for s, _ in found)
    if step is not None:
        found = [(s, d) for s, d in found if s == step]
    if not found:
        held = f" (it holds step(s) {', '.join(map(str, steps))})" if steps else ""
        what = f"no checkpoint of step {step}" if step is not None else "no checkpoints"
        subs = (
            sorted(d.name for d in Path(run_dir).iterdir() if (d / "checkpoints").is_dir())
            if os.path.isdir(run_dir)
            else []
        )
        hint = f"; it holds runs {', '.join(subs)}: pass one of them" if subs else ""
        raise ConfigError(f"{run_dir}: {what} found under checkpoints/{held}{hint}")
    for _, folder in found:
        try:
            return load_model_state(folder)
        except ConfigError as e:
            print(f"entrain: {e}; trying the previous checkpoint", file=sys.stderr, flush=True)
    raise ConfigError(f"{run_dir}: no complete checkpoint (every one is missing a file or corrupt)")


def export(run_dir: str, out: str, step: int | None = None) -> dict:
    """Write the HF folders; returns the summary (also written as ``entrain_export.json``)."""
    import torch
    from transformers import LlamaForCausalLM
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    from entrain.models.config import IMAGE_PAD_ID, get_model_config
    from entrain.models.vlm import _llm_hf_config, _vision_hf_config

    manifest, params = _choose(run_dir, step)
    if manifest.get("model_source"):
        return _export_stock(run_dir, out, manifest, params)
    cfg = get_model_config(manifest["model"])
    llm_config = _llm_hf_config(cfg)
    llm_config._attn_implementation = "sdpa"  # the exported model runs with standard attention
    parts = {
        "vision": (Qwen2_5_VisionTransformerPretrainedModel, _vision_hf_config(cfg), "vision."),
        "llm": (LlamaForCausalLM, llm_config, "llm."),
    }
    files = []
    for name, (cls, hf_config, prefix) in parts.items():
        state = {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}
        torch.manual_seed(0)
        module = cls(hf_config)
        expected = set(module.state_dict())
        if set(state) != expected:
            missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
            raise ConfigError(
                f"{run_dir}: the checkpoint's {name} parameters do not match the {cfg.name} preset "
                f"(missing {missing[:3]}, unexpected {extra[:3]})"
            )
        module.load_state_dict(state)
        folder = Path(out) / name
        module.save_pretrained(folder, safe_serialization=True)
        files += sorted(str(folder / f) for f in os.listdir(folder))
    return _write_info(run_dir, out, manifest, params, cfg.token_id(IMAGE_PAD_ID), files)


def _write_info(run_dir: str, out: str, manifest: dict, params: dict, image_token_id: int, files: list) -> dict:
    """The export summary, also written as ``entrain_export.json``."""
    info = {
        "run": str(run_dir),
        "step": int(manifest["step"]),
        "model": manifest["model"],
        "system": manifest.get("system"),
        "out": str(out),
        "vision": str(Path(out) / "vision"),
        "llm": str(Path(out) / "llm"),
        "image_token_id": image_token_id,
        "num_parameters": sum(v.numel() for v in params.values()),
        "files": files,
    }
    Path(out, EXPORT_INFO).write_text(json.dumps(info, indent=1) + "\n")
    return info


def _export_stock(run_dir: str, out: str, manifest: dict, params: dict) -> dict:
    """A run of stock folders: ``vision/`` with the vision checkpoint's own tower config (vision-only),
    ``llm/`` with the LLM's config.json (vocab_size grown by any added tokens; untied, since
    embedding and lm_head were trained apart) and its tokenizer, image tokens included."""
    from entrain.data.tokenizer import IMAGE_TOKENS, model_tokenizer
    from entrain.models.hf_checkpoint import build_stock_llm, build_stock_vision

    source = manifest["model_source"]
    vision = build_stock_vision(source["vision_model"])
    vocab = params["llm.model.embed_tokens.weight"].shape[0]
    llm = build_stock_llm(source["llm_model"], "sdpa", vocab_size=vocab)
    files = []
    for name, module, prefix in (("vision", vision, "vision."), ("llm", llm, "llm.")):
        state = {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}
        missing, unexpected = module.load_state_dict(state, strict=False, assign=True)
        if missing or unexpected:
            raise ConfigError(
                f"{run_dir}: the checkpoint's {name} parameters do not match {source[name + '_model']} "
                f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
            )
        folder = Path(out) / name
        module.save_pretrained(folder, safe_serialization=True)
        files += sorted(str(folder / f) for f in os.listdir(folder))
    tok = model_tokenizer(source.get("tokenizer"), source["llm_model"], vocab)
    if tok.hf is not None:
        tok.hf.save_pretrained(Path(out) / "llm")
    llm_files = [str(Path(out) / "llm" / f) for f in os.listdir(Path(out) / "llm")]
    files = sorted(set(files + llm_files))
    return _write_info(run_dir, out, manifest, params, tok.token_id(IMAGE_TOKENS[2]), files)


def run(args: argparse.Namespace) -> int:
    info = export(args.run_dir, args.out, args.step)
    if args.json:
        from entrain.cli.common import emit_json

        emit_json(info)
    else:
        print(
            f"exported step {info['step']} of {info['run']} ({info['model']}, "
            f"{info['num_parameters']:,} parameters) to {info['vision']} and {info['llm']}"
        )
    return 0
