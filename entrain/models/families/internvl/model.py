"""InternVL as pipeline stages, over transformers' own ``InternVLForConditionalGeneration``.

Shape legend: ``n`` tiles of the packed images, ``P`` patches per tile (1024 for 448-px tiles at
patch 14), ``D`` InternViT width, ``M`` LLM image tokens (``n x image_seq_length``), ``H`` LLM width.

* **Encoder** layers: ``[embeddings, layer 0 .. L-1, merger]``. Each tile is an independent InternViT
  sequence (CLS + ``P`` patches), so the packed tiles of a microbatch are one batch ``[n, P + 1, D]``;
  between stages they travel flattened ``[n * (P + 1), D]``. The merger is transformers' own code:
  the CLS token dropped, ``InternVLModel.pixel_shuffle`` and the ``multi_modal_projector``, giving
  ``[M, H]`` in tile order (each image's grid tiles, then its thumbnail), the order in which
  ``InternVLModel`` scatters them into the ``<IMG_CONTEXT>`` positions.
* **LLM** layers: ``[embed_tokens, decoder layers..., norm, lm_head, loss]`` of the language model
  (Qwen2, Qwen3 or Llama), packed samples with 1-D positions restarting per sample
  (``entrain.models.families.tiled_model``: the layout, loading and LLM stages it shares with
  LLaVA-OneVision).

Parameters keep transformers' names (``model.vision_tower...``, ``model.multi_modal_projector...``,
``model.language_model...``, ``lm_head.weight``), so gradients compare with transformers' model tensor
by tensor. A checkpoint is built on the meta device and a rank reads only its stages' tensors (the
legacy names ``vision_tower...``, ``language_model.model...`` of transformers 4 read too; a tied
checkpoint's lm_head is its embedding, trained untied).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import nn

from entrain.models.families import tiled_model as tiled
from entrain.models.families.internvl.spec import check_supported
from entrain.models.families.tiled_model import PROJECTOR, VISION, rows_to_tiles, tiles_to_rows

__all__ = [
    "InternVLModel",
    "EncoderStage",
    "LLMStage",
    "read_config",
    "hf_config_of",
    "build_model",
    "build_stage",
    "set_trainable",
    "tiles_to_rows",
    "rows_to_tiles",
    "FAMILY",
]

FAMILY = "internvl"


def read_config(folder: str):
    """The folder's ``InternVLConfig`` (ConfigError naming the file if it is not one we train)."""
    cfg = tiled.read_hf_config(folder, FAMILY)
    check_supported(cfg.to_dict(), os.path.join(folder, "config.json"))
    return cfg


def hf_config_of(run_cfg):
    """The run's ``InternVLConfig``: its folder's, with the profiler's reduced depths when set."""
    cfg = read_config(run_cfg.folder)
    if run_cfg.depths is not None:
        cfg.vision_config.num_hidden_layers, layers = run_cfg.depths
        text = cfg.text_config
        text.num_hidden_layers = layers
        if getattr(text, "layer_types", None):
            text.layer_types = text.layer_types[:layers]
    return cfg


class InternVLModel(tiled.TiledModel):
    """Holds transformers' ``InternVLForConditionalGeneration`` (``.hf``); trained with an untied lm_head."""

    entrain_family = FAMILY

    def __init__(self, cfg, *, meta: bool, run_cfg=None):
        from transformers import InternVLForConditionalGeneration

        check_supported(cfg.to_dict())
        layers = cfg.vision_config.num_hidden_layers
        super().__init__(
            cfg, InternVLForConditionalGeneration, meta=meta, run_cfg=run_cfg, feature_layers=layers
        )


def build_model(
    folder: str, *, config=None, stages: Sequence[tuple[str, int, int]] | None = None, run_cfg=None
) -> InternVLModel:
    """The model of checkpoint ``folder`` (``config``: its config, e.g. with reduced depths) on the meta
    device with only the parameters of ``stages`` ((component, first, end); None: all) read as float32
    CPU tensors."""
    model = InternVLModel(config if config is not None else read_config(folder), meta=True, run_cfg=run_cfg)
    tiled.load_stages(model, folder, stages, build_stage)
    return model


def set_trainable(
    model: InternVLModel, *, encoder: bool = True, merger: bool = True, llm: bool = True
) -> None:
    """Freeze or unfreeze the InternViT tower, the projector (with the tower's final norm), the LLM."""
    final_norm = f"{VISION}layernorm."
    for name, p in model.hf.named_parameters():
        if name.startswith(PROJECTOR) or name.startswith(final_norm):
            p.requires_grad_(merger)
        elif name.startswith(VISION):
            p.requires_grad_(encoder)
        else:
            p.requires_grad_(llm)


def tiles_of(grid: torch.Tensor) -> int:
    """Tiles of the seam's ``[images, 3]`` grid rows ``(tiles, side, side)``."""
    if grid.dim() != 2 or grid.shape[1] != 3:
        raise ValueError(
            f"{FAMILY} encoder grid must be [images, 3] (tiles, side, side), got {tuple(grid.shape)}"
        )
    return int(grid[:, 0].sum())


class EncoderStage(tiled.TowerStage):
    """Encoder layers ``[first, end)`` of ``[embeddings, layers..., merger]``.

    Input: ``[n * P, C * patch**2]`` patch rows (first stage) or ``[n * (P + 1), D]`` states. Output:
    ``[n * (P + 1), D]`` or, after the merger, ``[M, H]`` LLM image tokens in tile order."""

    entrain_family = FAMILY

    def owned_parameters(self) -> list[tuple[str, nn.Parameter]]:
        tower = self.tower
        parts: list[tuple[str, nn.Module]] = []
        if self.has_embeddings:
            parts.append(("embeddings", tower.embeddings))
        parts += [(f"encoder.layer.{i}", tower.encoder.layer[i]) for i in self.layer_ids]
        if self.has_merger:
            parts.append(("layernorm", tower.layernorm))
        params = tiled.owned(VISION, parts)
        if self.has_merger:
            params += [(f"{PROJECTOR}{n}", p) for n, p in self.projector.named_parameters()]
        return params

    def transformer_layers(self) -> tuple[list[nn.Module], str]:
        """The InternViT layers the stage runs, and the name of their attention sub-module."""
        return [self.tower.encoder.layer[i] for i in self.layer_ids], "attention"

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        n = tiles_of(grid)
        tower = self.tower
        if self.has_embeddings:  # patch rows (the seam's encoder input) back to tiles
            cfg = tower.config
            x = tower.embeddings(rows_to_tiles(x, n, cfg.num_channels, cfg.patch_size[0]))
        x = x.view(n, -1, x.shape[-1])
        for i in self.layer_ids:
            x = tower.encoder.layer[i](x)
        if not self.has_merger:
            return x.reshape(-1, x.shape[-1])
        return self._merge(tower.layernorm(x))

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        """``InternVLModel.get_image_features`` after the tower: CLS dropped, pixel shuffle, projector."""
        x = x[:, 1:, :]
        n, patches = x.shape[0], x.shape[1]
        side = int(patches**0.5)
        x = self.outer.pixel_shuffle(
            x.reshape(n, side, side, -1), scale_factor=self.outer.config.downsample_ratio
        )
        x = self.projector(x.reshape(n, -1, x.shape[-1]))
        return x.reshape(-1, x.shape[-1])


class LLMStage(tiled.LLMStage):
    """LLM layers ``[first, end)`` of ``[embed_tokens, layers..., norm, lm_head, loss]``
    (``tiled_model.LLMStage``)."""

    entrain_family = FAMILY
    """Not the base class's: the runtime asks this family (recompute, FSDP units) for the stage."""


def build_stage(model: InternVLModel, component: str, first: int, end: int) -> EncoderStage | LLMStage:
    """The stage module of layers ``[first, end)`` of ``component`` (``encoder`` or ``llm``)."""
    return tiled.build_stage(model, component, first, end, EncoderStage, LLMStage)
