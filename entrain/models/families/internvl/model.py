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
  (Qwen2, Qwen3 or Llama), packed samples with 1-D positions restarting per sample (LLaVA-OneVision's
  ``LLMStage``: the same ``model.language_model`` / ``lm_head`` layout).

Parameters keep transformers' names (``model.vision_tower...``, ``model.multi_modal_projector...``,
``model.language_model...``, ``lm_head.weight``), so gradients compare with transformers' model tensor
by tensor. A checkpoint is built on the meta device and a rank reads only its stages' tensors (the
legacy names ``vision_tower...``, ``language_model.model...`` of transformers 4 read too; a tied
checkpoint's lm_head is its embedding, trained untied).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from entrain.core.errors import ConfigError
from entrain.models.families.composition.attention import PACKED_ATTENTION
from entrain.models.families.internvl.spec import check_supported
from entrain.models.families.llava_onevision import model as ov

__all__ = [
    "InternVLModel",
    "EncoderStage",
    "LLMStage",
    "read_config",
    "hf_config_of",
    "build_model",
    "build_stage",
    "stage_layers",
    "set_trainable",
    "tiles_to_rows",
    "rows_to_tiles",
    "FAMILY",
]

FAMILY = "internvl"
VISION = "model.vision_tower."
PROJECTOR = "model.multi_modal_projector."
tiles_to_rows, rows_to_tiles = ov.tiles_to_rows, ov.rows_to_tiles


def read_config(folder: str):
    """The folder's ``InternVLConfig`` (ConfigError naming the file if it is not one we train)."""
    from transformers import AutoConfig

    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no config.json")
    try:
        cfg = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: transformers cannot read it ({e})") from None
    if cfg.model_type != FAMILY:
        raise ConfigError(f"{path}: model_type {cfg.model_type!r} is not {FAMILY}")
    check_supported(cfg.to_dict(), path)
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


class InternVLModel(nn.Module):
    """Holds transformers' model (``.hf``); trained with an untied lm_head."""

    entrain_family = FAMILY

    def __init__(self, cfg, *, meta: bool, run_cfg=None):
        super().__init__()
        self.cfg = run_cfg
        """The family's run config (``family.InternVLRunConfig``; None for a bare model)."""
        from transformers import InternVLForConditionalGeneration

        check_supported(cfg.to_dict())
        cfg.tie_word_embeddings = False
        cfg.text_config.tie_word_embeddings = False
        cfg.text_config._attn_implementation = PACKED_ATTENTION
        self.config = cfg
        if not meta:
            self.hf = InternVLForConditionalGeneration(cfg)
            return
        with torch.device("meta"):
            self.hf = InternVLForConditionalGeneration(cfg)
        lm = self.hf.model.language_model
        lm.rotary_emb = type(lm.rotary_emb)(config=cfg.text_config)

    def layer_names(self, component: str) -> list[str]:
        if component == "encoder":
            n = self.config.vision_config.num_hidden_layers
            return ["embeddings", *(f"layers.{i}" for i in range(n)), "merger"]
        if component == "llm":
            layers = [f"layers.{i}" for i in range(self.config.text_config.num_hidden_layers)]
            return ["embed_tokens", *layers, "norm", "lm_head", "loss"]
        raise ConfigError(f"unknown component {component!r} (encoder or llm)")


def build_model(
    folder: str, *, config=None, stages: Sequence[tuple[str, int, int]] | None = None, run_cfg=None
) -> InternVLModel:
    """The model of checkpoint ``folder`` (``config``: its config, e.g. with reduced depths) on the meta
    device with only the parameters of ``stages`` ((component, first, end); None: all) read as float32
    CPU tensors."""
    model = InternVLModel(config if config is not None else read_config(folder), meta=True, run_cfg=run_cfg)
    if stages is None:
        stages = [(c, 0, len(model.layer_names(c))) for c in ("encoder", "llm")]
    names = [n for c, a, b in stages for n, _ in build_stage(model, c, a, b).owned_parameters()]
    ov.materialize(model, names, folder)
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


def _owned(prefix: str, parts: Iterable[tuple[str, nn.Module]]) -> list[tuple[str, nn.Parameter]]:
    return [(f"{prefix}{n}.{pn}", p) for n, m in parts for pn, p in m.named_parameters()]


def tiles_of(grid: torch.Tensor) -> int:
    """Tiles of the seam's ``[images, 3]`` grid rows ``(tiles, side, side)``."""
    if grid.dim() != 2 or grid.shape[1] != 3:
        raise ValueError(
            f"{FAMILY} encoder grid must be [images, 3] (tiles, side, side), got {tuple(grid.shape)}"
        )
    return int(grid[:, 0].sum())


class EncoderStage(nn.Module):
    """Encoder layers ``[first, end)`` of ``[embeddings, layers..., merger]``.

    Input: ``[n * P, C * patch**2]`` patch rows (first stage) or ``[n * (P + 1), D]`` states. Output:
    ``[n * (P + 1), D]`` or, after the merger, ``[M, H]`` LLM image tokens in tile order."""

    entrain_family = FAMILY

    def __init__(self, model: InternVLModel, first: int, end: int):
        super().__init__()
        self.tower = model.hf.model.vision_tower
        self.projector = model.hf.model.multi_modal_projector
        object.__setattr__(self, "outer", model.hf.model)  # pixel_shuffle; no submodule
        k = model.config.vision_config.num_hidden_layers
        self.first, self.end = first, end
        self.has_embeddings = first == 0
        self.layer_ids = list(range(max(first, 1) - 1, min(end, k + 1) - 1))
        self.has_merger = end == k + 2

    def owned_parameters(self) -> list[tuple[str, nn.Parameter]]:
        tower = self.tower
        parts: list[tuple[str, nn.Module]] = []
        if self.has_embeddings:
            parts.append(("embeddings", tower.embeddings))
        parts += [(f"encoder.layer.{i}", tower.encoder.layer[i]) for i in self.layer_ids]
        if self.has_merger:
            parts.append(("layernorm", tower.layernorm))
        owned = _owned(VISION, parts)
        if self.has_merger:
            owned += [(f"{PROJECTOR}{n}", p) for n, p in self.projector.named_parameters()]
        return owned

    def move_to(self, device: torch.device) -> None:
        for _, p in self.owned_parameters():
            p.data = p.data.to(device)

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


class LLMStage(ov.LLMStage):
    """LLM layers ``[first, end)`` of ``[embed_tokens, layers..., norm, lm_head, loss]`` (LLaVA-OneVision's
    stage: the same ``model.language_model`` / ``lm_head`` modules and names)."""

    entrain_family = FAMILY


def stage_layers(stage: EncoderStage | LLMStage) -> tuple[list[nn.Module], str]:
    """The transformer layers a stage runs, and the name of their attention sub-module."""
    if isinstance(stage, EncoderStage):
        return [stage.tower.encoder.layer[i] for i in stage.layer_ids], "attention"
    return [stage.llm.model.layers[i] for i in stage.layer_ids], "self_attn"


def build_stage(model: InternVLModel, component: str, first: int, end: int) -> EncoderStage | LLMStage:
    """The stage module of layers ``[first, end)`` of ``component`` (``encoder`` or ``llm``)."""
    n = len(model.layer_names(component))
    if not 0 <= first < end <= n:
        raise ConfigError(f"{component} stage layers [{first}, {end}) outside 0..{n}")
    if component == "encoder":
        return EncoderStage(model, first, end)
    return LLMStage(model, first, end)
