"""A whole Qwen2-VL / Qwen2.5-VL checkpoint's architecture from its ``config.json`` (torch-free).

The vision tower is read as the composition reads a Qwen2(.5)-VL vision folder; the language model
is Qwen2 (q/k/v with bias, RMSNorm, SwiGLU) from ``text_config`` (transformers 5) or the top level
(checkpoints saved before it). M-RoPE changes no FLOP or byte, so the cost model prices the LLM as
any Qwen2 decoder.
"""

from __future__ import annotations

import os

from entrain.core.errors import ConfigError
from entrain.core.model.architectures import LLMArch, ModelArch
from entrain.models.families.composition.spec import vision_arch
from entrain.models.families.registry import read_config

__all__ = ["MODEL_TYPES", "claims", "text_config_of", "text_arch", "shape_of_folder", "check_supported"]

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
_TEXT_FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")


def claims(config: dict) -> bool:
    """True for a whole Qwen2-VL / Qwen2.5-VL ``config.json`` (not a vision-only one)."""
    return config.get("model_type") in MODEL_TYPES


def text_config_of(config: dict) -> dict:
    """The language model's fields: ``text_config`` over the top level (older checkpoints are flat)."""
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else dict(config)


def _rope_theta(text: dict) -> float:
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    return float(text.get("rope_theta") or params.get("rope_theta") or 1_000_000.0)


def text_arch(config: dict, where: str) -> LLMArch:
    text = text_config_of(config)
    missing = [k for k in _TEXT_FIELDS if k not in text]
    if missing:
        raise ConfigError(f"{where}: the language model's config lacks {', '.join(missing)}")
    tied = bool(config.get("tie_word_embeddings") or text.get("tie_word_embeddings"))
    try:
        heads = int(text["num_attention_heads"])
        return LLMArch(
            num_hidden_layers=int(text["num_hidden_layers"]),
            hidden_size=int(text["hidden_size"]),
            intermediate_size=int(text["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(text.get("num_key_value_heads") or heads),
            vocab_size=int(text["vocab_size"]),
            tie_word_embeddings=tied,
            rope_theta=_rope_theta(text),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(text.get("max_position_embeddings", 32_768)),
            hidden_act=str(text.get("hidden_act", "silu")),
            qkv_bias=True,
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: bad language model config value ({e})") from None


def check_supported(config: dict, where: str) -> None:
    """Refuse what the stages do not reproduce exactly (``plan``, ``data check`` and ``train`` alike):
    the one place of this family's unsupported-config rules. ``config``: the ``config.json`` dict."""
    text = text_config_of(config)
    heads = int(text.get("num_attention_heads") or 1)
    width = int(text.get("hidden_size") or 0) // heads
    if text.get("head_dim") not in (None, width):
        raise ConfigError(
            f"{where}: text_config head_dim {text['head_dim']} is not supported: the language model's attention "
            f"uses hidden_size / num_attention_heads = {width} and head_dim only resizes its rotary table"
        )
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    section = rope.get("mrope_section") if isinstance(rope, dict) else None
    if section is not None and 2 * sum(section) != width:
        raise ConfigError(
            f"{where}: text_config mrope_section {list(section)} sums to {sum(section)}, not half the "
            f"head dimension {width} (hidden_size / num_attention_heads)"
        )
    if text.get("use_sliding_window"):
        raise ConfigError(
            f"{where}: text_config use_sliding_window true is not supported: the packed attention is full "
            "causal attention per sample"
        )
    vision = config.get("vision_config") or {}
    channels = vision.get("in_channels", vision.get("in_chans", 3))
    if channels != 3:
        raise ConfigError(
            f"{where}: vision_config in_channels {channels} is not supported: the image processor makes "
            "RGB patches (3 channels)"
        )


def shape_of_folder(folder: str) -> ModelArch:
    """The ``ModelArch`` (vision tower incl. merger + Qwen2 LLM) of checkpoint ``folder``; ConfigError
    naming ``config.json`` and the field otherwise."""
    where = os.path.join(folder, "config.json")
    config = read_config(folder)
    if not claims(config):
        raise ConfigError(
            f"{where}: model_type {config.get('model_type')!r} is not a whole Qwen2-VL / Qwen2.5-VL "
            f"checkpoint (expected one of {', '.join(MODEL_TYPES)})"
        )
    check_supported(config, where)
    vision, llm = vision_arch(folder), text_arch(config, where)
    if vision.out_hidden_size != llm.hidden_size:
        raise ConfigError(
            f"{where}: the merger outputs {vision.out_hidden_size} features but the language model's "
            f"hidden size is {llm.hidden_size}"
        )
    name = f"hf:{os.path.basename(os.path.normpath(folder))}"
    return ModelArch(name=name, vision=vision, llm=llm, description=f"{config['model_type']} {folder}")
