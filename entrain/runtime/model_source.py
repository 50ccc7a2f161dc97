"""The model a run trains, through its model family (``entrain.models.families``).

``model_source`` turns the run's flags into a ``ModelSource``; ``model_family`` picks the family
(``registry.family_of_source``); ``model_arch`` gives the shapes (for check_spec and the cost model)
without touching a tokenizer; ``model_config`` is the family's runtime config and tokenizer
(``ModelFamily.runtime_config``).
"""

from __future__ import annotations

from entrain.config import RunConfig
from entrain.core.errors import ConfigError
from entrain.models.families.base import ModelFamily, ModelShape, ModelSource
from entrain.models.families.registry import family_of_source

__all__ = ["model_source", "model_family", "model_arch", "model_config"]


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
