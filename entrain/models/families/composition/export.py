"""``entrain export`` of the composition: two Hugging Face folders.

    DIR/vision/   config.json + model.safetensors   the vision tower (its merger projects to the LLM width)
    DIR/llm/      config.json + model.safetensors   the causal LM (and a stock LLM's tokenizer)

A preset's tower is a ``Qwen2_5_VisionTransformerPretrainedModel`` and its LLM a ``LlamaForCausalLM``;
a run of stock folders writes the vision checkpoint's own tower config (vision-only) and the LLM's
config.json (vocab_size grown by any added tokens; untied, since embedding and lm_head were trained
apart) with its tokenizer, image tokens included.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from entrain.core.errors import ConfigError

__all__ = ["export"]


def export(manifest: dict, params: dict[str, torch.Tensor], out: str) -> dict:
    """``ModelFamily.export``: the ``vision`` and ``llm`` folders, ``image_token_id`` and ``files``."""
    if manifest.get("model_source"):
        return _export_stock(out, manifest, params)
    return _export_preset(out, manifest, params)


def _export_preset(out: str, manifest: dict, params: dict) -> dict:
    from transformers import LlamaForCausalLM
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    from entrain.models.families.composition.config import IMAGE_PAD_ID, get_model_config
    from entrain.models.families.composition.model import llm_hf_config, vision_hf_config

    cfg = get_model_config(manifest["model"])
    llm_config = llm_hf_config(cfg)
    llm_config._attn_implementation = "sdpa"  # the exported model runs with standard attention
    parts = {
        "vision": (Qwen2_5_VisionTransformerPretrainedModel, vision_hf_config(cfg), "vision."),
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
                f"the checkpoint's {name} parameters do not match the {cfg.name} preset "
                f"(missing {missing[:3]}, unexpected {extra[:3]})"
            )
        module.load_state_dict(state)
        files += _save(module, Path(out) / name)
    return _fields(out, cfg.token_id(IMAGE_PAD_ID), files)


def _save(module, folder: Path) -> list[str]:
    module.save_pretrained(folder, safe_serialization=True)
    return sorted(str(folder / f) for f in os.listdir(folder))


def _fields(out: str, image_token_id: int, files: list[str]) -> dict:
    return {
        "vision": str(Path(out) / "vision"),
        "llm": str(Path(out) / "llm"),
        "image_token_id": image_token_id,
        "files": files,
    }


def _export_stock(out: str, manifest: dict, params: dict) -> dict:
    from entrain.data.tokenizer import IMAGE_TOKENS, model_tokenizer
    from entrain.models.families.composition.hf_checkpoint import build_stock_llm, build_stock_vision

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
                f"the checkpoint's {name} parameters do not match {source[name + '_model']} "
                f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
            )
        files += _save(module, Path(out) / name)
    tok = model_tokenizer(source.get("tokenizer"), source["llm_model"], vocab)
    if tok.hf is not None:
        tok.hf.save_pretrained(Path(out) / "llm")
    llm_files = [str(Path(out) / "llm" / f) for f in os.listdir(Path(out) / "llm")]
    return _fields(out, tok.token_id(IMAGE_TOKENS[2]), sorted(set(files + llm_files)))
