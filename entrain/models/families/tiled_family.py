"""What the tiled whole-checkpoint families share behind ``ModelFamily`` (torch-free at import):
``TiledFamily``, the members alike for a model whose ViT runs each image tile as its own sequence and
whose stages are ``entrain.models.families.tiled_model``'s (InternVL, LLaVA-OneVision), and what
their ``spec`` modules share: ``required`` (a ``config.json`` field or a ConfigError naming it) and
``llm_arch_of`` (the language model of a ``text_config``)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from entrain.core.errors import ConfigError
from entrain.core.model.architectures import LLMArch
from entrain.models.families.base import FamilyBase

if TYPE_CHECKING:
    from torch import nn

__all__ = ["TiledFamily", "required", "llm_arch_of"]


def required(d: dict, key: str, where: str):
    """``d[key]``; ConfigError naming ``where`` and the field when it is missing."""
    if key not in d:
        raise ConfigError(f"{where}: missing field {key!r}")
    return d[key]


def llm_arch_of(text: dict, where: str, **flags) -> LLMArch:
    """The ``LLMArch`` of a ``config.json``'s ``text_config`` dict ``text`` (its sizes, heads and
    vocabulary; ConfigError naming a missing field); ``flags``: the ties and biases the family reads
    its own way."""
    w = f"{where}: text_config"
    heads = int(required(text, "num_attention_heads", w))
    return LLMArch(
        num_hidden_layers=int(required(text, "num_hidden_layers", w)),
        hidden_size=int(required(text, "hidden_size", w)),
        intermediate_size=int(required(text, "intermediate_size", w)),
        num_attention_heads=heads,
        num_key_value_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text["head_dim"]) if text.get("head_dim") else None,
        vocab_size=int(required(text, "vocab_size", w)),
        **flags,
    )


class TiledFamily(FamilyBase):
    """A family's shape has ``vision.num_layers`` tower layers and an ``llm`` (``LLMArch``); its stages
    are ``tiled_model.TowerStage`` / ``LLMStage`` subclasses; its run config has ``shape``. A subclass
    says ``reduced_config`` (the profiler's one-layer model) and what is its own."""

    def layer_names(self, shape: Any, component: str) -> list[str]:
        if component == "encoder":
            return ["embeddings", *(f"layers.{i}" for i in range(shape.vision.num_layers)), "merger"]
        if component == "llm":
            layers = [f"layers.{i}" for i in range(shape.llm.num_hidden_layers)]
            return ["embed_tokens", *layers, "norm", "lm_head", "loss"]
        raise ConfigError(f"unknown component {component!r}; expected 'encoder' or 'llm'")

    def no_pixel_limits(self, rule: Any, min_pixels: int | None, max_pixels: int | None, how: str) -> Any:
        """``rule`` (a tiling rule): ``--min-pixels`` / ``--max-pixels`` do not apply (ConfigError if
        given, unless they are the rule's own placeholders, which a plan file records and ``train
        --plan`` replays); ``how``: how the family tiles, for the error."""
        if min_pixels not in (None, rule.min_pixels) or max_pixels not in (None, rule.max_pixels):
            raise ConfigError(
                f"--min-pixels / --max-pixels: {self.name} tiles every image ({how}), no pixel limits"
            )
        return rule

    def encoder_output_width(self, stage: nn.Module) -> int:
        return stage.projector.linear_2.out_features if stage.has_merger else stage.tower.config.hidden_size

    def recompute_modules(self, stage: nn.Module, mode: str) -> list[nn.Module]:
        """``selective``: each layer's attention; ``full``: the transformer layers of the stage."""
        if mode == "none":
            return []
        layers, attention = stage.transformer_layers()
        return [getattr(layer, attention) for layer in layers] if mode == "selective" else layers

    def fsdp_units(self, stage: nn.Module) -> list[nn.Module]:
        return stage.transformer_layers()[0]

    def reduced_config(self, cfg: Any, small: Any) -> Any:
        """The run config of ``small`` (``cfg``'s shape with one tower layer and one decoder layer)."""
        raise NotImplementedError

    def representative_config(self, cfg: Any):
        """One tower layer and one decoder layer (every layer of a kind costs the same)."""
        s = cfg.shape
        small = replace(s, vision=replace(s.vision, num_layers=1), llm=replace(s.llm, num_hidden_layers=1))
        d, n = s.vision.num_layers, s.llm.num_hidden_layers
        enc = {0: 0, d + 1: 2, **{i + 1: 1 for i in range(d)}}
        llm = {0: 0, n + 1: 2, n + 2: 3, n + 3: 4, **{i + 1: 1 for i in range(n)}}
        return self.reduced_config(cfg, small), {"encoder": enc, "llm": llm}
