"""LLaVA-OneVision as pipeline stages, over transformers' own ``LlavaOnevisionForConditionalGeneration``.

Shape legend: ``n`` tiles of the packed images, ``P`` vision tokens per tile (729 for 384-px tiles
at patch 14), ``D`` SigLIP width, ``M`` LLM image tokens of the packed images (AnyRes: base tile,
unpadded grid, newlines), ``T`` packed LLM tokens, ``H`` LLM width.

* **Encoder** layers: ``[embeddings, encoder layer 0 .. K-1, merger]``, K the layers up to
  ``vision_feature_layer`` (-1: all). Each tile is an independent SigLIP sequence, so the packed
  tiles of every image of a microbatch are one batch ``[n, P, D]``; between stages they travel
  flattened ``[n * P, D]``. The "merger" is the projector + ``pack_image_features`` (unpadding,
  ``vision_aspect_ratio`` shrinking, ``image_newline``), transformers' own code, giving ``[M, H]``
  in image order.
* **LLM** layers: ``[embed_tokens, decoder layers..., norm, lm_head, loss]`` of the Qwen2 language
  model, packed samples with 1-D positions restarting per sample and the packed varlen attention
  (``entrain.models.families.tiled_model``: the layout, loading and LLM stages it shares with InternVL).

Parameters keep transformers' names (``model.vision_tower...``, ``model.language_model...``,
``lm_head.weight``), so gradients compare with transformers' model tensor by tensor. The model is
built on the meta device and a rank reads only its stages' tensors from the folder's safetensors
(transformers 5 writes the legacy names ``vision_tower...``, ``language_model.model...``,
``language_model.lm_head...``, ``image_newline``; both spellings are read).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from entrain.core.errors import ConfigError
from entrain.models.families import tiled_model as tiled
from entrain.models.families.llava_onevision.spec import check_supported as check_supported_config
from entrain.models.families.tiled_model import (
    PROJECTOR,
    VISION,
    checkpoint_keys,
    rows_to_tiles,
    tiles_to_rows,
)

__all__ = [
    "OneVisionModel",
    "TileBatch",
    "EncoderStage",
    "LLMStage",
    "read_config",
    "build_model",
    "build_stage",
    "set_trainable",
    "checkpoint_keys",
    "hf_config_of",
    "tiles_to_rows",
    "rows_to_tiles",
    "FAMILY",
]

FAMILY = "llava_onevision"

NEWLINE = "model.image_newline"


def read_config(folder: str):
    """The folder's ``LlavaOnevisionConfig`` (ConfigError naming the file if it is not one we train)."""
    cfg = tiled.read_hf_config(folder, FAMILY)
    check_supported(cfg, os.path.join(folder, "config.json"))
    return cfg


def hf_config_of(shape):
    """A ``LlavaOnevisionConfig`` of a preset's ``OneVisionShape`` (image token: the last vocabulary id)."""
    from transformers import LlavaOnevisionConfig

    v, llm, rules = shape.vision, shape.llm, shape.rules
    vision = dict(model_type="siglip_vision_model", hidden_size=v.hidden_size, intermediate_size=v.intermediate_size,
                  num_hidden_layers=v.num_layers, num_attention_heads=v.num_heads, image_size=v.image_size,
                  patch_size=v.patch_size, vision_use_head=False)  # fmt: skip
    text = dict(model_type="qwen2", hidden_size=llm.hidden_size, intermediate_size=llm.intermediate_size,
                num_hidden_layers=llm.num_hidden_layers, num_attention_heads=llm.num_attention_heads,
                num_key_value_heads=llm.num_key_value_heads, vocab_size=llm.vocab_size, rope_theta=llm.rope_theta,
                rms_norm_eps=llm.rms_norm_eps, tie_word_embeddings=False)  # fmt: skip
    return LlavaOnevisionConfig(
        vision_config=vision, text_config=text, image_token_index=llm.vocab_size - 1,
        video_token_index=llm.vocab_size - 2, image_grid_pinpoints=[list(p) for p in rules.grid_pinpoints],
        vision_aspect_ratio=f"anyres_max_{rules.max_tiles}", multimodal_projector_bias=shape.projector_bias,
    )  # fmt: skip


def check_supported(cfg, where: str = "config") -> None:
    """Refuse what the stages do not reproduce exactly (``spec.check_supported`` on the config's dict)."""
    check_supported_config(cfg.to_dict(), where)
    if not isinstance(cfg.vision_feature_layer, int):
        raise ConfigError(f"{where}: vision_feature_layer must be one layer, not {cfg.vision_feature_layer}")


def feature_layers(cfg) -> int:
    """SigLIP encoder layers whose output the projector reads (``vision_feature_layer``)."""
    total = cfg.vision_config.num_hidden_layers
    k = cfg.vision_feature_layer
    k = k if k >= 0 else total + 1 + k
    if not 0 <= k <= total:
        raise ConfigError(f"vision_feature_layer {cfg.vision_feature_layer} outside 0..{total}")
    return k


class OneVisionModel(tiled.TiledModel):
    """Holds transformers' ``LlavaOnevisionForConditionalGeneration`` (``.hf``); trained with an untied
    lm_head (embedding and lm_head may sit on different stages)."""

    entrain_family = FAMILY

    def __init__(self, cfg, *, meta: bool, run_cfg=None):
        from transformers import LlavaOnevisionForConditionalGeneration

        check_supported(cfg)
        hf_class = LlavaOnevisionForConditionalGeneration
        super().__init__(cfg, hf_class, meta=meta, run_cfg=run_cfg, feature_layers=feature_layers(cfg))

    def on_meta(self) -> None:
        emb = self.hf.model.vision_tower.embeddings
        emb.position_ids = torch.arange(emb.num_positions).expand((1, -1))


def build_model(
    folder: str | None = None,
    *,
    config=None,
    seed: int = 0,
    stages: Sequence[tuple[str, int, int]] | None = None,
    run_cfg=None,
) -> OneVisionModel:
    """The model of checkpoint ``folder`` on the meta device with only the parameters of ``stages``
    ((component, first, end); None: all) read as float32 CPU tensors; or, from ``config`` alone, a
    random float32 model from ``seed``."""
    if folder is None:
        if config is None:
            raise ConfigError("build_model needs a checkpoint folder or a config")
        torch.manual_seed(seed)
        model = OneVisionModel(config, meta=False, run_cfg=run_cfg)
        model.hf.lm_head.weight.data.copy_(model.hf.model.language_model.embed_tokens.weight.data)
        return model
    model = OneVisionModel(read_config(folder), meta=True, run_cfg=run_cfg)
    tiled.load_stages(model, folder, stages, build_stage)
    return model


def set_trainable(
    model: OneVisionModel, *, encoder: bool = True, merger: bool = True, llm: bool = True
) -> None:
    """Freeze or unfreeze the SigLIP tower, the projector + image_newline, the language model."""
    for name, p in model.hf.named_parameters():
        if name.startswith(VISION):
            p.requires_grad_(encoder)
        elif name.startswith(PROJECTOR) or name == NEWLINE:
            p.requires_grad_(merger)
        else:
            p.requires_grad_(llm)


# --------------------------------------------------------------------------------------------------
# Encoder stages


@dataclass
class TileBatch:
    """The packed images of a (sub-)microbatch: ``pixel_values [n, 3, S, S]`` every image's tiles in
    image order (base tile first, then the grid row by row); ``image_sizes [images, 2]`` (height,
    width) of the original images; ``tiles_per_image`` (1 for an image among several in its sample)."""

    pixel_values: torch.Tensor
    image_sizes: torch.Tensor
    tiles_per_image: tuple[int, ...]


def tile_batch_of(grid: torch.Tensor) -> TileBatch:
    """The ``TileBatch`` (without pixels) of the seam's ``[images, 5]`` grid rows."""
    if grid.dim() != 2 or grid.shape[1] != 5:
        raise ValueError(
            f"{FAMILY} encoder grid must be [images, 5] (tiles, h, w, H, W), got {tuple(grid.shape)}"
        )
    return TileBatch(None, grid[:, 3:5].cpu(), tuple(int(t) for t in grid[:, 0].tolist()))


class EncoderStage(tiled.TowerStage):
    """Encoder layers ``[first, end)`` of ``[embeddings, layers..., merger]``.

    Input: ``TileBatch.pixel_values`` or its ``tiles_to_rows`` ``[n * P, C * patch**2]`` (first stage),
    or ``[n * P, D]`` states. Output ``[n * P, D]``
    or, after the merger, ``[M, H]`` LLM image tokens in image order.
    """

    entrain_family = FAMILY

    def __init__(self, model: OneVisionModel, first: int, end: int):
        super().__init__(model, first, end)
        if self.has_merger:  # the stage's own submodule: FSDP shards and reduces the stage's module tree
            self.newline = nn.Module()
            self.newline.image_newline = model.hf.model.image_newline

    def owned_parameters(self) -> list[tuple[str, nn.Parameter]]:
        tower = self.tower
        parts: list[tuple[str, nn.Module]] = []
        if self.has_embeddings:
            parts.append(("embeddings", tower.embeddings))
        parts += [(f"encoder.layers.{i}", tower.encoder.layers[i]) for i in self.layer_ids]
        params = tiled.owned(VISION, parts)
        if self.has_merger:
            params += [(f"{PROJECTOR}{n}", p) for n, p in self.projector.named_parameters()]
            params.append((NEWLINE, self.newline.image_newline))
        return params

    def transformer_layers(self) -> tuple[list[nn.Module], str]:
        """The SigLIP layers the stage runs, and the name of their attention sub-module."""
        return [self.tower.encoder.layers[i] for i in self.layer_ids], "self_attn"

    def move_to(self, device: torch.device) -> None:
        super().move_to(device)
        emb = self.tower.embeddings
        emb.position_ids = emb.position_ids.to(device)

    def forward(self, x: torch.Tensor, tiles: TileBatch | torch.Tensor) -> torch.Tensor:
        """``tiles``: a ``TileBatch``, or the seam's ``[images, 5]`` grid rows ``(tiles, side, side, H,
        W)`` (``image_grids`` + ``image_extras``)."""
        if isinstance(tiles, torch.Tensor):
            tiles = tile_batch_of(tiles)
        tower = self.tower
        n = sum(tiles.tiles_per_image)
        if self.has_embeddings:
            if x.dim() == 2:  # patch rows (the seam's encoder input) back to tiles
                cfg = tower.config
                x = rows_to_tiles(x, n, cfg.num_channels, cfg.patch_size)
            x = tower.embeddings(x)
        x = x.view(n, -1, x.shape[-1])
        for i in self.layer_ids:
            x = tower.encoder.layers[i](x, None)
        if not self.has_merger:
            return x.reshape(-1, x.shape[-1])
        feats = self.projector(x).split(list(tiles.tiles_per_image))
        packed, _ = self.outer.pack_image_features(
            feats,
            tiles.image_sizes,
            image_newline=self.newline.image_newline,
            vision_aspect_ratio=self.outer.config.vision_aspect_ratio,
        )
        return torch.cat(packed)


# --------------------------------------------------------------------------------------------------
# LLM stages


class LLMStage(tiled.LLMStage):
    """LLM layers ``[first, end)`` of ``[embed_tokens, layers..., norm, lm_head, loss]`` of the Qwen2
    language model (``tiled_model.LLMStage``)."""

    entrain_family = FAMILY
    """Not the base class's: the runtime asks this family (recompute, FSDP units) for the stage."""


def build_stage(model: OneVisionModel, component: str, first: int, end: int) -> EncoderStage | LLMStage:
    """The stage module of layers ``[first, end)`` of ``component`` (``encoder`` or ``llm``)."""
    return tiled.build_stage(model, component, first, end, EncoderStage, LLMStage)
