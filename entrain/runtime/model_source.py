"""The model a run trains, through its model family (``entrain.models.families``).

``model_source`` turns the run's flags into a ``ModelSource``; ``model_family`` picks the family
(``registry.family_of_source``); ``model_arch`` gives the shapes (for check_spec and the cost model)
without touching a tokenizer; ``model_config`` is the family's runtime config and tokenizer
(``ModelFamily.runtime_config``).
"""

from __future__ import annotations

from entrain.config import RunConfig
from entrain.core.errors import ConfigError
from entrain.core.planning.plan_file import checkpoint_fingerprints
from entrain.models.families.base import ModelFamily, ModelShape, ModelSource
from entrain.models.families.registry import family_of_source

__all__ = ["model_source", "model_family", "model_arch", "model_config", "checkpoint_content", "CONTENT_KEY"]

CONTENT_KEY = "checkpoint_fingerprint"
"""The resume fingerprint's key of the run's checkpoint folders' content (``checkpoint_content``)."""


def model_source(spec: RunConfig) -> ModelSource:
    model = spec.model
    if model.tokenizer and not (model.llm_model or model.model_path):
        raise ConfigError(
            "--tokenizer applies to a stock --llm-model or --model-path (the presets use the Qwen2 tokenizer)"
        )
    return model.source()


def model_family(spec: RunConfig) -> ModelFamily:
    return family_of_source(model_source(spec))


def model_arch(spec: RunConfig) -> ModelShape:
    source = model_source(spec)
    return family_of_source(source).shape(source)


def model_config(spec: RunConfig):
    """``(cfg, tokenizer)`` of the run's family: the tokenizer is None for a preset (its records use the
    built-in Qwen2 tokenizer, remapped by the family's ``map_token_id``)."""
    source = model_source(spec)
    return family_of_source(source).runtime_config(source)


def checkpoint_content(spec: RunConfig) -> dict:
    """``{CONTENT_KEY: {flag dest: sha256}}`` of the run's checkpoint folders (``--model-path``,
    ``--vision-model``, ``--llm-model``; ``entrain.core.safetensors_header.checkpoint_fingerprint``),
    {} for a preset: the resume fingerprint binds a run to its base checkpoint's content."""
    model = spec.model
    folders = {k: getattr(model, k, None) for k in ("model_path", "vision_model", "llm_model")}
    found = checkpoint_fingerprints({k: v for k, v in folders.items() if v})
    return {CONTENT_KEY: found} if found else {}
