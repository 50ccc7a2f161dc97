"""The model a run trains: a preset, or stock Hugging Face folders with their tokenizer.

``model_arch`` gives the shapes (for check_spec and the cost model) without touching a tokenizer;
``model_config`` resolves the tokenizer of a stock LLM (``entrain.data.tokenizer.model_tokenizer``),
grows the vocabulary by the tokens it had to add (new embedding rows: see
``entrain.models.hf_checkpoint``) and maps the Qwen2 image ids the renderer uses onto the
tokenizer's ids.
"""

from __future__ import annotations

from dataclasses import replace

from entrain.config import RunConfig
from entrain.core.architectures import ModelArch
from entrain.core.errors import ConfigError
from entrain.core.hf_config import ModelSource
from entrain.models.config import QWEN2_SPECIAL_BASE, VLMConfig, get_model_config

__all__ = ["model_source", "model_arch", "model_config"]


def model_source(spec: RunConfig) -> ModelSource:
    model = spec.model
    if model.tokenizer and not model.llm_model:
        raise ConfigError("--tokenizer applies to a stock --llm-model (the presets use the Qwen2 tokenizer)")
    return ModelSource(preset=model.name, vision_model=model.vision_model, llm_model=model.llm_model)


def model_arch(spec: RunConfig) -> ModelArch:
    return model_source(spec).arch()


def model_config(spec: RunConfig):
    """``(VLMConfig, tokenizer)``: the tokenizer is None for a preset (its records use the built-in
    Qwen2 tokenizer, remapped by ``VLMConfig.token_id``)."""
    source = model_source(spec)
    if not source.is_stock:
        return get_model_config(spec.model.name), None
    from entrain.data.tokenizer import QWEN2_SPECIAL_TOKENS, model_tokenizer

    arch = source.arch()
    tok = model_tokenizer(spec.model.tokenizer, source.llm_model, arch.llm.vocab_size)
    vocab = max(arch.llm.vocab_size, len(tok))
    arch = replace(arch, llm=replace(arch.llm, vocab_size=vocab))
    special = tuple(
        (qid, tok.special_tokens[name])
        for name, qid in QWEN2_SPECIAL_TOKENS.items()
        if qid >= QWEN2_SPECIAL_BASE and name in tok.special_tokens
    )
    cfg = VLMConfig(arch=arch, vision_dir=source.vision_model, llm_dir=source.llm_model, special_ids=special)
    return cfg, tok
