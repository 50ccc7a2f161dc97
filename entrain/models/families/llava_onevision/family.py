"""The LLaVA-OneVision family (SigLIP tiles + projector + Qwen2, AnyRes) behind ``ModelFamily``.

Sources: the presets ``llava-ov-7b`` (LLaVA-OneVision-7B's published shape) and ``llava-ov-tiny``, or
one whole ``LlavaOnevisionForConditionalGeneration`` checkpoint folder (``--model-path``). Torch-free
at import: the torch parts (``model``) are imported inside the methods.

The encoder stages get each image's original ``(H, W)`` (what AnyRes unpads by) as the seam's
``image_extras`` columns; the renderer's token counts are ``sample_feature_rows`` (the multi-image
rule). Tensor parallel: ``tp`` (SigLIP layers, projector, the composition's Qwen2 plan).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from entrain.core.errors import ConfigError
from entrain.models.families.base import ModelSource
from entrain.models.families.llava_onevision.presets import PRESETS
from entrain.models.families.llava_onevision.processing import (
    OneVisionImageRule,
    chat_ids,
    image_tiles,
    sample_tokens,
)
from entrain.models.families.llava_onevision.spec import OneVisionShape, check_processor, shape_from_config
from entrain.models.families.tiled_family import TiledFamily

if TYPE_CHECKING:
    from torch import nn

    from entrain.core.workload.samples import SampleMeta

__all__ = ["OneVisionFamily", "ONEVISION_FAMILY", "OneVisionConfig", "FAMILY"]

FAMILY = "llava_onevision"
MODEL_TYPE = "llava_onevision"


@dataclass(frozen=True)
class OneVisionConfig:
    """The family's run config: the shape, and the checkpoint folder (None: a seeded preset)."""

    shape: OneVisionShape
    folder: str | None = None
    family: str = FAMILY

    @property
    def name(self) -> str:
        return self.shape.name

    def layer_names(self, component: str) -> list[str]:
        return ONEVISION_FAMILY.layer_names(self.shape, component)


class OneVisionFamily(TiledFamily):
    name = FAMILY
    description = (
        "LLaVA-OneVision: SigLIP 384-px tiles (AnyRes) + 2-layer projector + Qwen2 (--model-path, llava-ov-*)"
    )

    # --- plain numbers ----------------------------------------------------------------------------
    def preset_names(self) -> tuple[str, ...]:
        return tuple(PRESETS)

    def code_names(self) -> tuple[str, ...]:
        return (FAMILY, "LlavaOnevision", "llava-ov-", "siglip", "Siglip")

    def claims_config(self, config: dict) -> bool:
        return config.get("model_type") == MODEL_TYPE

    def model_types(self) -> tuple[str, ...]:
        return (MODEL_TYPE,)

    def shape(self, source: ModelSource) -> OneVisionShape:
        if source.model_path is None:
            try:
                return PRESETS[source.preset]
            except KeyError:
                raise ConfigError(
                    f"unknown {FAMILY} preset {source.preset!r}; choose from {', '.join(PRESETS)}"
                ) from None
        import os

        from entrain.models.families.registry import read_config

        where = os.path.join(source.model_path, "config.json")
        shape = shape_from_config(read_config(source.model_path), f"hf:{source.model_path}", where)
        check_processor(source.model_path, shape.rules)
        return shape

    def image_rule(
        self, shape: OneVisionShape, min_pixels: int | None, max_pixels: int | None
    ) -> OneVisionImageRule:
        """AnyRes tiles (``--min-pixels`` / ``--max-pixels`` do not apply: ConfigError if given, unless
        they are the rule's own placeholders, which a plan file records and ``train --plan`` replays)."""
        return self.no_pixel_limits(OneVisionImageRule(shape.rules), min_pixels, max_pixels, "AnyRes")

    def check_tp(self, shape: OneVisionShape, tp: int) -> None:
        from entrain.models.families.llava_onevision.tp import check_tp

        check_tp(shape, tp)

    # --- runtime ---------------------------------------------------------------------------------
    def runtime_config(
        self, source: ModelSource, shape: OneVisionShape | None = None
    ) -> tuple[OneVisionConfig, Any]:
        return OneVisionConfig(shape or self.shape(source), source.model_path), None

    def build_model(
        self, cfg: OneVisionConfig, *, seed=0, weights_dir=None, dtype=None, stages=None
    ) -> nn.Module:
        from entrain.models.families.llava_onevision import model as ov

        if weights_dir is not None:
            raise ConfigError(f"--weights: a {FAMILY} model reads its weights from --model-path")
        if cfg.folder is not None:
            return ov.build_model(cfg.folder, stages=stages, run_cfg=cfg)
        return ov.build_model(config=ov.hf_config_of(cfg.shape), seed=seed, run_cfg=cfg)

    def empty_model(self, cfg: OneVisionConfig) -> nn.Module:
        from entrain.models.families.llava_onevision import model as ov

        return ov.OneVisionModel(ov.hf_config_of(cfg.shape), meta=True, run_cfg=cfg)

    def build_stage(self, model: nn.Module, component: str, first: int, end: int) -> nn.Module:
        from entrain.models.families.llava_onevision.model import build_stage

        return build_stage(model, component, first, end)

    def set_trainable(self, model: nn.Module, *, encoder=True, merger=True, llm=True) -> None:
        from entrain.models.families.llava_onevision.model import set_trainable

        set_trainable(model, encoder=encoder, merger=merger, llm=llm)

    def apply_tp(self, stage: nn.Module, mesh: Any) -> None:
        from entrain.models.families.llava_onevision.tp import apply_tp

        apply_tp(stage, mesh)

    # --- processing rules --------------------------------------------------------------------------
    def image_grids(self, cfg: OneVisionConfig, meta: SampleMeta) -> tuple[tuple[int, int, int], ...]:
        """``(tiles, side, side)`` per image (``side`` = 27 for 384-px tiles at patch 14). The grid
        alone does not give the image's LLM tokens: AnyRes unpads by the original (H, W)."""
        side = cfg.shape.rules.side
        alone = len(meta.images) == 1
        return tuple((image_tiles(h, w, cfg.shape.rules, alone=alone), side, side) for h, w in meta.images)

    def image_feature_rows(self, cfg: OneVisionConfig, grid: tuple[int, int, int]) -> int:
        raise ConfigError(
            f"{FAMILY}: an image's LLM tokens depend on its original size (AnyRes unpadding), which the "
            "(tiles, h, w) grid does not carry; use sample_feature_rows"
        )

    def image_extras(self, cfg: OneVisionConfig, meta: SampleMeta) -> tuple[tuple[int, ...], ...]:
        """The original ``(H, W)`` of each image (``EncoderStage`` unpads by it)."""
        return tuple((int(h), int(w)) for h, w in meta.images)

    def sample_feature_rows(self, cfg: OneVisionConfig, meta: SampleMeta) -> tuple[int, ...]:
        """``processing.sample_tokens``: AnyRes for a lone image, one tile + newline for each of several."""
        return tuple(sample_tokens(meta.images, cfg.shape.rules))

    def encoder_input_width(self, cfg: OneVisionConfig) -> int:
        return cfg.shape.vision.patch_dim

    def process_images(self, cfg: OneVisionConfig, images, rule) -> tuple[Any, Any]:
        """One sample's PIL ``images`` through transformers' ``LlavaOnevisionImageProcessorPil`` (the
        folder's ``preprocessor_config.json`` when there is one): patch rows ``[N, C * patch**2]`` of
        every tile (``model.tiles_to_rows``) and ``(tiles, side, side)`` per image."""
        import numpy as np
        import torch

        from entrain.models.families.llava_onevision.model import tiles_to_rows
        from entrain.models.families.llava_onevision.processing import image_processor

        got = image_processor(cfg)([list(images)], return_tensors="pt")
        tiles = [
            image_tiles(h, w, cfg.shape.rules, alone=len(images) == 1) for h, w in got["image_sizes"].tolist()
        ]
        pixels = [got["pixel_values"][i, :n] for i, n in enumerate(tiles)]
        rows = tiles_to_rows(torch.cat(pixels), cfg.shape.vision.patch_size)
        side = cfg.shape.rules.side
        return rows.numpy().astype(np.float32), np.array([(n, side, side) for n in tiles], dtype=np.int64)

    def format_chat(
        self, cfg: OneVisionConfig, turns, image_tokens, tokenizer
    ) -> tuple[list[int], list[int]]:
        """``LlavaOnevisionProcessor``'s prompt: n ``<image>`` tokens per image, no markers
        (``processing.chat_ids``)."""
        return chat_ids(turns, image_tokens, tokenizer)

    def token_ids(self, cfg: OneVisionConfig) -> dict[str, int]:
        """``<image>`` is the config's ``image_token_index``; no start/end markers."""
        image = cfg.shape.llm.vocab_size - 1 if cfg.folder is None else _image_token_id(cfg.folder)
        return {"image": image, "image_start": -1, "image_end": -1}

    def map_token_id(self, cfg: OneVisionConfig, qwen_id: int) -> int:
        """Text ids wrap below the image/video token ids (a real checkpoint's Qwen2 vocabulary keeps
        every regular id; a tiny one wraps them); Qwen2's ``<|image_pad|>`` (what ``format_chat``
        writes for a tokenizer without ``<image>``) becomes the image token id."""
        from entrain.data.tokenizer import QWEN2_SPECIAL_TOKENS

        if qwen_id == QWEN2_SPECIAL_TOKENS["<|image_pad|>"]:
            return self.token_ids(cfg)["image"]
        return qwen_id % _first_special_id(cfg)

    # --- export ------------------------------------------------------------------------------------
    def export(self, manifest: dict, params: dict, out_dir: str) -> dict:
        """One folder ``LlavaOnevisionForConditionalGeneration.from_pretrained`` loads (``export``)."""
        from entrain.models.families.llava_onevision.export import export

        return export(manifest, params, out_dir)

    # --- profiler ----------------------------------------------------------------------------------
    def reduced_config(self, cfg: OneVisionConfig, small: OneVisionShape) -> OneVisionConfig:
        return OneVisionConfig(small, None)

    def profile_input(
        self, cfg: OneVisionConfig, component: str, layer: int, tokens: int, device, per_label: bool
    ):
        from entrain.models.families.llava_onevision.profiling import profile_input

        return profile_input(cfg, component, layer, tokens, device, per_label)


def _first_special_id(cfg: OneVisionConfig) -> int:
    """The smallest of the image / video token ids (ids from there up are not text)."""
    if cfg.folder is None:
        return cfg.shape.llm.vocab_size - 2
    from entrain.models.families.registry import read_config

    config = read_config(cfg.folder)
    return min(int(config.get("image_token_index", 151646)), int(config.get("video_token_index", 151647)))


def _image_token_id(folder: str) -> int:
    from entrain.models.families.registry import read_config

    return int(read_config(folder).get("image_token_index", 151646))


ONEVISION_FAMILY = OneVisionFamily()
