"""Model architectures read from stock Hugging Face checkpoint folders (``config.json`` only, no torch).

``--vision-model DIR`` is a Qwen2-VL or Qwen2.5-VL folder: the whole ``...ForConditionalGeneration``
(its ``vision_config`` is used) or a vision-only one (``model_type`` ``qwen2_vl_vision`` /
``qwen2_5_vl_vision``). ``--llm-model DIR`` is a causal LM with Llama's layer structure
(``LlamaForCausalLM``, ``Qwen2ForCausalLM``, or any ``model_type`` with the same config fields).
The cost model, the planner and the runtime all take the model's shapes from here, so a user's own
checkpoints need no preset.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

from entrain.core.errors import ConfigError
from entrain.core.model.architectures import LLMArch, ModelArch, VisionArch
from entrain.models.families.base import ModelSource
from entrain.models.families.qwen2_vl.processing import processor_settings
from entrain.models.families.registry import read_config

__all__ = ["composition_arch", "read_config", "vision_arch", "llm_arch", "arch_from_folders"]

_VISION_TYPES = {"qwen2_5_vl": "qwen2_5_vl", "qwen2_5_vl_vision": "qwen2_5_vl", "qwen2_vl": "qwen2_vl",
                 "qwen2_vl_vision": "qwen2_vl"}  # fmt: skip
_LLM_FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")


def composition_arch(source: ModelSource) -> ModelArch:
    """The ``ModelArch`` of a ``ModelSource``: its preset, or its two stock folders (both needed)."""
    if not source.is_stock:
        from entrain.core.model.architectures import get_arch

        return get_arch(source.preset)
    if source.vision_model is None or source.llm_model is None:
        given, missing = ("--vision-model", "--llm-model")[:: 1 if source.vision_model else -1]
        raise ConfigError(f"{given} needs {missing} too: a stock model is a vision folder plus an LLM folder")
    return arch_from_folders(source.vision_model, source.llm_model)


def _rope_theta(cfg: dict, default: float) -> float:
    params = cfg.get("rope_parameters") or {}
    return float(cfg.get("rope_theta") or params.get("rope_theta") or default)


def vision_config_of(cfg: dict, where: str) -> tuple[dict, str]:
    """The vision tower's config dict and family of a whole or vision-only Qwen2(.5)-VL config."""
    model_type = cfg.get("model_type")
    if model_type not in _VISION_TYPES:
        raise ConfigError(
            f"{where}: model_type {model_type!r} is not a Qwen2-VL / Qwen2.5-VL checkpoint "
            f"(expected one of {', '.join(_VISION_TYPES)})"
        )
    vision = cfg.get("vision_config", cfg) if not model_type.endswith("_vision") else cfg
    if not isinstance(vision, dict):
        raise ConfigError(f"{where}: vision_config is not an object")
    return vision, _VISION_TYPES[model_type]


def processor_limits(folder: str) -> dict[str, int]:
    """``min_pixels`` / ``max_pixels`` of the folder's ``preprocessor_config.json`` (the keys the
    published Qwen2-VL / Qwen2.5-VL folders write, or transformers 5's ``size`` {shortest_edge,
    longest_edge}); {} without the file or the keys."""
    path = os.path.join(folder, "preprocessor_config.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            proc = json.load(f)
        size = proc.get("size") if isinstance(proc.get("size"), dict) else {}
        limits = {"min_pixels": proc.get("min_pixels", size.get("shortest_edge")),
                  "max_pixels": proc.get("max_pixels", size.get("longest_edge"))}  # fmt: skip
        return {k: int(v) for k, v in limits.items() if v is not None}
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise ConfigError(f"{path}: cannot read the image processor's pixel limits ({e})") from None


def vision_arch(folder: str) -> VisionArch:
    where = os.path.join(folder, "config.json")
    v, family = vision_config_of(read_config(folder), where)
    arch = replace(vision_arch_of_config(v, family, where), **processor_limits(folder))
    processor_settings(folder, (arch.patch_size, arch.spatial_merge_size, arch.temporal_patch_size))
    return arch


def vision_arch_of_config(v: dict, family: str, where: str) -> VisionArch:
    try:
        if family == "qwen2_vl":  # hidden_size is the merger output; embed_dim the ViT width
            width = int(v["embed_dim"])
            return VisionArch(
                depth=int(v["depth"]),
                hidden_size=width,
                intermediate_size=int(width * float(v.get("mlp_ratio", 4))),
                num_heads=int(v["num_heads"]),
                out_hidden_size=int(v["hidden_size"]),
                fullatt_block_indexes=tuple(range(int(v["depth"]))),
                patch_size=int(v.get("patch_size", 14)),
                temporal_patch_size=int(v.get("temporal_patch_size", 2)),
                spatial_merge_size=int(v.get("spatial_merge_size", 2)),
                in_channels=int(v.get("in_channels", 3)),
                hidden_act=str(v.get("hidden_act", "quick_gelu")),
                norm="layer",
                mlp="plain",
            )
        return VisionArch(
            depth=int(v["depth"]),
            hidden_size=int(v["hidden_size"]),
            intermediate_size=int(v["intermediate_size"]),
            num_heads=int(v["num_heads"]),
            out_hidden_size=int(v["out_hidden_size"]),
            fullatt_block_indexes=_full_attention_blocks(v),
            window_size=int(v.get("window_size", 112)),
            patch_size=int(v.get("patch_size", 14)),
            temporal_patch_size=int(v.get("temporal_patch_size", 2)),
            spatial_merge_size=int(v.get("spatial_merge_size", 2)),
            in_channels=int(v.get("in_channels", 3)),
            hidden_act=str(v.get("hidden_act", "silu")),
        )
    except KeyError as e:
        raise ConfigError(f"{where}: vision config lacks {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: bad vision config value ({e})") from None


def _full_attention_blocks(vision: dict) -> tuple[int, ...]:
    """The blocks of ``fullatt_block_indexes`` the tower has: transformers runs block ``i`` with full
    attention iff ``i`` is in the list, so an index past the depth (the default ``[7, 15, 23, 31]`` of
    a shallower tower) selects nothing. Missing: transformers' default."""
    depth = int(vision["depth"])
    listed = vision.get("fullatt_block_indexes", (7, 15, 23, 31))
    return tuple(sorted({int(i) for i in listed if 0 <= int(i) < depth}))


def llm_arch(folder: str) -> LLMArch:
    where = os.path.join(folder, "config.json")
    cfg = read_config(folder)
    if "text_config" in cfg and "num_hidden_layers" not in cfg:
        raise ConfigError(
            f"{where}: model_type {cfg.get('model_type')!r} is a multimodal checkpoint; --llm-model takes a "
            "causal-LM folder (e.g. LlamaForCausalLM or Qwen2ForCausalLM)"
        )
    missing = [k for k in _LLM_FIELDS if k not in cfg]
    if missing:
        raise ConfigError(
            f"{where}: not a Llama-structured causal LM (model_type {cfg.get('model_type')!r}; lacks "
            f"{', '.join(missing)})"
        )
    qwen2 = cfg.get("model_type") == "qwen2"
    try:
        heads = int(cfg["num_attention_heads"])
        return LLMArch(
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            vocab_size=int(cfg["vocab_size"]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            head_dim=int(cfg["head_dim"]) if cfg.get("head_dim") else None,
            rope_theta=_rope_theta(cfg, 10_000.0),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 32_768)),
            hidden_act=str(cfg.get("hidden_act", "silu")),
            qkv_bias=qwen2,
            attention_bias=bool(cfg.get("attention_bias", False)) and not qwen2,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: bad LLM config value ({e})") from None


def arch_from_folders(vision_model: str, llm_model: str) -> ModelArch:
    """The ``ModelArch`` of a stock vision folder plus a stock LLM folder; ConfigError (naming both
    folders) when the merger's output width differs from the LLM's hidden size."""
    vision, llm = vision_arch(vision_model), llm_arch(llm_model)
    name = f"hf:{os.path.basename(os.path.normpath(vision_model))}+{os.path.basename(os.path.normpath(llm_model))}"
    if vision.out_hidden_size != llm.hidden_size:
        raise ConfigError(
            f"--vision-model {vision_model}: its merger outputs {vision.out_hidden_size} features but "
            f"--llm-model {llm_model} has hidden size {llm.hidden_size}; the image features must match the "
            "LLM width (pick a vision checkpoint trained for this LLM size, or retrain the merger)"
        )
    return ModelArch(name=name, vision=vision, llm=llm, description=f"{vision_model} + {llm_model}")
