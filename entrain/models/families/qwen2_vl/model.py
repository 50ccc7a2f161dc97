"""A whole Qwen2-VL / Qwen2.5-VL checkpoint as Entrain pipeline stages.

The model is transformers' own ``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration``
built on the meta device; only the parameters of a rank's stages are read from the folder's
safetensors (float32, on the CPU), so parameter names are the transformers model's
(``model.visual.*``, ``model.language_model.*``, ``lm_head.weight``). Checkpoints saved before
transformers 5 (``visual.*``, ``model.layers.*``) load too. A tied checkpoint (no ``lm_head.weight``)
gives its lm_head a copy of the embedding: embedding and lm_head may sit on different stages, so
they train untied.

Stages reuse Entrain's shared stage modules: the encoder stage runs ``[patch_embed, blocks...,
merger]`` of ``model.visual`` (windowed / per-image attention by ``entrain_flash_windows``), the LLM
stage ``[embed_tokens, layers..., norm, lm_head, loss]`` of the language model with its M-RoPE
rotary table fed ``[3, T]`` position ids (``positions.mrope_position_ids``) and packed causal
attention per sample (``entrain_packed``, ``entrain_seq_lens``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import SimpleNamespace

import torch
from torch import nn

from entrain.core.errors import ConfigError
from entrain.models.families.composition.hf_checkpoint import (
    SafetensorsFolder,
    assign_tensor,
    check_unexpected,
)
from entrain.models.families.composition.model import EncoderStage, LLMStage
from entrain.models.families.packed_attention import PACKED_ATTENTION, use_varlen_vision_attention
from entrain.models.families.qwen2_vl.spec import check_supported

__all__ = [
    "MODEL_TYPES",
    "read_hf_config",
    "conditional_generation_class",
    "build_model",
    "build_stage",
    "layer_counts",
    "load_parameters",
    "checkpoint_key",
    "set_trainable",
    "untie",
]

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
VISION_PREFIX = "model.visual."
LLM_PREFIX = "model.language_model."


def read_hf_config(folder: str):
    """Transformers' config of the whole checkpoint in ``folder``; ConfigError unless it is one of
    ``MODEL_TYPES``."""
    from transformers import AutoConfig

    from entrain.models.families.registry import read_config

    model_type = read_config(folder).get("model_type")
    if model_type not in MODEL_TYPES:
        raise ConfigError(
            f"{folder}/config.json: model_type {model_type!r} is not a whole Qwen2-VL / Qwen2.5-VL "
            f"checkpoint (expected one of {', '.join(MODEL_TYPES)})"
        )
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{folder}/config.json: transformers cannot read it ({e})") from None
    check_supported(read_config(folder), f"{folder}/config.json")
    return config


def untie(config) -> bool:
    """Set ``config`` (and its text config, where transformers 5 also reads the flag) untied; returns
    whether it was tied."""
    text = config.get_text_config()
    tied = bool(getattr(config, "tie_word_embeddings", False) or getattr(text, "tie_word_embeddings", False))
    config.tie_word_embeddings = False
    if hasattr(text, "tie_word_embeddings"):
        text.tie_word_embeddings = False
    return tied


def conditional_generation_class(model_type: str) -> type:
    if model_type == "qwen2_vl":
        from transformers import Qwen2VLForConditionalGeneration

        return Qwen2VLForConditionalGeneration
    from transformers import Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration


def layer_counts(model: nn.Module) -> dict[str, int]:
    """Stage-layer list lengths: ``encoder`` = patch_embed + blocks + merger, ``llm`` = embed + layers
    + norm + lm_head + loss."""
    return {
        "encoder": len(model.model.visual.blocks) + 2,
        "llm": len(model.model.language_model.layers) + 4,
    }


def build_model(
    folder: str, *, stages: Sequence[tuple[str, int, int]] | None = None, hf_config=None, strict: bool = True
) -> nn.Module:
    """The model of checkpoint ``folder`` on the meta device with the parameters of ``stages``
    (``(component, first, end)``; None: all) loaded as float32 CPU tensors."""
    config = hf_config if hf_config is not None else read_hf_config(folder)
    tied = untie(config)
    with torch.device("meta"):
        model = conditional_generation_class(config.model_type)(config)
    model.entrain_tied_source = tied
    """The checkpoint ties lm_head to the embedding (export writes them untied)."""
    visual, lm = model.model.visual, model.model.language_model
    visual.rotary_pos_emb = type(visual.rotary_pos_emb)(visual.config)
    lm.rotary_emb = type(lm.rotary_emb)(config=lm.config)
    use_varlen_vision_attention(visual)
    lm.config._attn_implementation = PACKED_ATTENTION
    if stages is None:
        stages = [(c, 0, n) for c, n in layer_counts(model).items()]
    names = [n for c, a, b in stages for n, _ in build_stage(model, c, a, b).owned_parameters()]
    load_parameters(model, folder, names, strict=strict)
    return model


def checkpoint_key(name: str, reader: SafetensorsFolder) -> str:
    """The tensor of ``reader`` holding parameter ``name``: transformers 5's name, the older layout's
    (``visual.*``, ``model.layers.*``) or, for an lm_head of a tied checkpoint, the embedding."""
    candidates = [name]
    if name.startswith(VISION_PREFIX):
        candidates.append(name[len("model.") :])
    elif name.startswith(LLM_PREFIX):
        candidates.append("model." + name[len(LLM_PREFIX) :])
    elif name == "lm_head.weight":
        candidates += [LLM_PREFIX + "embed_tokens.weight", "model.embed_tokens.weight"]
    for key in candidates:
        if key in reader:
            return key
    raise ConfigError(f"{reader.folder}: the checkpoint has no tensor for {name!r} (looked for {candidates})")


def load_parameters(model: nn.Module, folder: str, names: Iterable[str], *, strict: bool = True) -> list[str]:
    """Replace the meta parameters ``names`` by the folder's tensors; returns the files read.
    ``strict``: the model is the folder's whole config.json (not the profiler's reduced one), so every
    parameter of it must have a tensor and every tensor a parameter (ConfigError naming a few)."""
    reader = SafetensorsFolder(folder)
    names = list(names)
    if strict and names:
        every = {n: checkpoint_key(n, reader) for n, _ in model.named_parameters()}
        check_unexpected(reader, every.values())
    keys = {n: checkpoint_key(n, reader) for n in names}
    tensors = reader.read(set(keys.values()))
    used: set[str] = set()
    for n, key in keys.items():  # a tied checkpoint's embedding feeds the lm_head too: own storage each
        t = tensors[key].clone() if key in used else tensors[key]
        used.add(key)
        assign_tensor(model, n, t, f"{folder}: {key}")
    return sorted(reader.read_files)


class QwenEncoderStage(EncoderStage):
    """Layers ``[first, end)`` of ``[patch_embed, blocks..., merger]`` of ``model.visual``."""

    def __init__(self, model: nn.Module, first: int, end: int):
        super().__init__(SimpleNamespace(vision=model.model.visual), first, end)
        self.prefix = VISION_PREFIX


class _LanguageModelView(nn.Module):
    """The language model and lm_head under the names the shared LLM stage expects (``model``,
    ``lm_head``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.model.language_model
        self.lm_head = model.lm_head


class QwenLLMStage(LLMStage):
    """Layers ``[first, end)`` of ``[embed_tokens, layers..., norm, lm_head, loss]``;
    ``batch.position_ids`` are the ``[3, T]`` M-RoPE ids."""

    def __init__(self, model: nn.Module, first: int, end: int):
        super().__init__(SimpleNamespace(llm=_LanguageModelView(model)), first, end)

    def owned_parameters(self) -> list[tuple[str, nn.Parameter]]:
        renamed = []
        for name, p in super().owned_parameters():
            rest = name[len("llm.") :]
            renamed.append((LLM_PREFIX + rest[len("model.") :] if rest.startswith("model.") else rest, p))
        return renamed


def build_stage(model: nn.Module, component: str, first: int, end: int) -> nn.Module:
    """The stage module of layers ``[first, end)`` of ``component`` (``encoder`` or ``llm``)."""
    n = layer_counts(model).get(component)
    if n is None:
        raise ConfigError(f"unknown component {component!r} (expected encoder or llm)")
    if not 0 <= first < end <= n:
        raise ConfigError(f"{component} stage layers [{first}, {end}) outside 0..{n}")
    return (QwenEncoderStage if component == "encoder" else QwenLLMStage)(model, first, end)


def set_trainable(model: nn.Module, *, encoder: bool = True, merger: bool = True, llm: bool = True) -> None:
    """``requires_grad`` per part (``--freeze``): the ViT body, its merger, the language model + lm_head."""
    for name, p in model.named_parameters():
        if name.startswith(VISION_PREFIX):
            p.requires_grad_(merger if name.startswith(VISION_PREFIX + "merger.") else encoder)
        else:
            p.requires_grad_(llm)
