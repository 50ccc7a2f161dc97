"""The InternVL family (InternViT tiles + pixel shuffle + projector + Qwen2 / Qwen3 / Llama) behind
``ModelFamily``.

Sources: one whole ``InternVLForConditionalGeneration`` checkpoint folder (``--model-path``; its
``config.json``, ``preprocessor_config.json`` and tokenizer files), or (``plan`` / ``simulate`` only) a
cost-model preset of ``presets.PRESETS`` (``internvl35-8b``: a published shape, no weights). Torch-free
at import: the torch parts (``model``, ``export``) are imported inside the methods.

An image's grid is ``(tiles, side, side)`` (``processing``: dynamic tiling with the thumbnail); its LLM
tokens ``tiles x image_seq_length``, between ``<img>`` and ``</img>``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from entrain.core.errors import ConfigError
from entrain.models.families.base import ModelSource
from entrain.models.families.internvl.presets import PRESETS
from entrain.models.families.internvl.processing import (
    InternVLImageRule,
    folder_token_ids,
    image_tiles,
    read_processor_config,
)
from entrain.models.families.internvl.spec import InternVLShape, shape_from_config
from entrain.models.families.tiled_family import TiledFamily

if TYPE_CHECKING:
    from torch import nn

    from entrain.core.workload.samples import SampleMeta

__all__ = ["InternVLFamily", "INTERNVL_FAMILY", "InternVLRunConfig", "FAMILY"]

FAMILY = "internvl"
MODEL_TYPE = "internvl"


@dataclass(frozen=True)
class InternVLRunConfig:
    """A run's model: the checkpoint ``folder`` and its ``shape``; ``depths`` (vision layers, decoder
    layers) replacing the checkpoint's (the profiler's reduced model, built empty)."""

    shape: InternVLShape
    folder: str
    depths: tuple[int, int] | None = None
    family: str = FAMILY

    @property
    def name(self) -> str:
        return self.shape.name

    def layer_names(self, component: str) -> list[str]:
        return INTERNVL_FAMILY.layer_names(self.shape, component)


class InternVLFamily(TiledFamily):
    name = FAMILY
    description = "InternVL: InternViT 448-px dynamic tiles + pixel shuffle + projector + Qwen2/Qwen3/Llama (--model-path; internvl35-8b: cost model only)"

    # --- plain numbers ----------------------------------------------------------------------------
    def preset_names(self) -> tuple[str, ...]:
        return tuple(PRESETS)

    def code_names(self) -> tuple[str, ...]:
        return (FAMILY, "InternVL", "InternViT", "GotOcr2")

    def claims_config(self, config: dict) -> bool:
        return config.get("model_type") == MODEL_TYPE

    def model_types(self) -> tuple[str, ...]:
        return (MODEL_TYPE,)

    def shape(self, source: ModelSource) -> InternVLShape:
        if source.model_path is None:
            if source.preset in PRESETS:
                return PRESETS[source.preset]
            raise ConfigError(
                f"model family {FAMILY!r} takes a checkpoint folder (--model-path DIR) or a cost-model preset "
                f"({', '.join(PRESETS)}), not {source.preset!r}"
            )
        from entrain.models.families.registry import read_config

        folder = source.model_path
        where = os.path.join(folder, "config.json")
        return shape_from_config(read_config(folder), f"hf:{folder}", where, read_processor_config(folder))

    def image_rule(
        self, shape: InternVLShape, min_pixels: int | None, max_pixels: int | None
    ) -> InternVLImageRule:
        """Dynamic tiles (``--min-pixels`` / ``--max-pixels`` do not apply: ConfigError if given, unless
        they are the rule's own placeholders, which a plan file records and ``train --plan`` replays)."""
        how = "min_patches..max_patches tiles of preprocessor_config.json"
        return self.no_pixel_limits(InternVLImageRule(shape.rules), min_pixels, max_pixels, how)

    # --- runtime ---------------------------------------------------------------------------------
    def runtime_config(
        self, source: ModelSource, shape: InternVLShape | None = None
    ) -> tuple[InternVLRunConfig, Any]:
        """The checkpoint's config; the tokenizer: ``--tokenizer``, else the folder's own files, else None
        (the built-in Qwen2 tokenizer)."""
        from entrain.data.tokenizer import has_tokenizer_files, load_tokenizer

        if source.model_path is None:
            raise ConfigError(
                f"--model {source.preset}: a cost-model preset (plan / simulate); to run the model, pass its "
                "checkpoint folder with --model-path DIR"
            )
        full = self.shape(source)
        depths = None
        if shape is not None and shape != full:  # the profiler's reduced model
            depths = (shape.vision.num_layers, shape.llm.num_hidden_layers)
        cfg = InternVLRunConfig(shape or full, source.model_path, depths)
        path = source.tokenizer or (source.model_path if has_tokenizer_files(source.model_path) else None)
        return cfg, (load_tokenizer(path) if path else None)

    def build_model(
        self, cfg: InternVLRunConfig, *, seed=0, weights_dir=None, dtype=None, stages=None
    ) -> nn.Module:
        from entrain.models.families.internvl import model as m

        if weights_dir is not None:
            raise ConfigError("--weights and --model-path both give the weights: pass one")
        return m.build_model(cfg.folder, config=m.hf_config_of(cfg), stages=stages, run_cfg=cfg)

    def empty_model(self, cfg: InternVLRunConfig) -> nn.Module:
        from entrain.models.families.internvl import model as m

        return m.InternVLModel(m.hf_config_of(cfg), meta=True, run_cfg=cfg)

    def build_stage(self, model: nn.Module, component: str, first: int, end: int) -> nn.Module:
        from entrain.models.families.internvl.model import build_stage

        return build_stage(model, component, first, end)

    def set_trainable(self, model: nn.Module, *, encoder=True, merger=True, llm=True) -> None:
        from entrain.models.families.internvl.model import set_trainable

        set_trainable(model, encoder=encoder, merger=merger, llm=llm)

    # --- processing rules --------------------------------------------------------------------------
    def image_grids(self, cfg: InternVLRunConfig, meta: SampleMeta) -> tuple[tuple[int, int, int], ...]:
        """``(tiles, side, side)`` per image (``side`` = 32 for 448-px tiles at patch 14)."""
        rules = cfg.shape.rules
        return tuple((image_tiles(h, w, rules), rules.side, rules.side) for h, w in meta.images)

    def image_feature_rows(self, cfg: InternVLRunConfig, grid: tuple[int, int, int]) -> int:
        return int(grid[0]) * cfg.shape.rules.tokens_per_tile

    def encoder_input_width(self, cfg: InternVLRunConfig) -> int:
        return cfg.shape.vision.patch_dim

    def process_images(self, cfg: InternVLRunConfig, images, rule) -> tuple[Any, Any]:
        """One sample's PIL ``images`` through transformers' ``GotOcr2ImageProcessorPil`` (the folder's
        ``preprocessor_config.json``, with ``crop_to_patches`` as ``InternVLProcessor`` passes it): patch
        rows ``[N, C * patch**2]`` of every tile (``model.tiles_to_rows``) and ``(tiles, side, side)``
        per image."""
        import numpy as np

        from entrain.models.families.internvl.model import tiles_to_rows
        from entrain.models.families.internvl.processing import image_processor

        rules = cfg.shape.rules
        got = image_processor(cfg)(list(images), crop_to_patches=rules.crop_to_patches, return_tensors="pt")
        rows = tiles_to_rows(got["pixel_values"], rules.patch_px)
        grids = [(int(n), rules.side, rules.side) for n in got["num_patches"]]
        return rows.numpy().astype(np.float32), np.array(grids, dtype=np.int64)

    def format_chat(
        self, cfg: InternVLRunConfig, turns, image_tokens, tokenizer
    ) -> tuple[list[int], list[int]]:
        """``processing.format_chat``: the tokenizer's chat template, images as ``InternVLProcessor``
        expands them."""
        from entrain.models.families.internvl.processing import format_chat

        return format_chat(turns, image_tokens, tokenizer)

    def token_ids(self, cfg: InternVLRunConfig) -> dict[str, int]:
        """``<IMG_CONTEXT>`` is the config's ``image_token_id``; ``<img>`` / ``</img>`` the tokenizer's
        (-1: a folder without tokenizer files has no markers)."""
        return dict(folder_token_ids(cfg.folder))

    def map_token_id(self, cfg: InternVLRunConfig, qwen_id: int) -> int:
        """Qwen2's vision markers become ``<img>`` / ``<IMG_CONTEXT>`` / ``</img>``; text ids wrap below
        the first of those (a real checkpoint's Qwen vocabulary keeps every regular id)."""
        from entrain.data.tokenizer import QWEN2_SPECIAL_TOKENS

        ids = self.token_ids(cfg)
        markers = {"<|vision_start|>": "image_start", "<|image_pad|>": "image", "<|vision_end|>": "image_end"}
        for token, key in markers.items():
            if qwen_id == QWEN2_SPECIAL_TOKENS[token] and ids[key] >= 0:
                return ids[key]
        return qwen_id % min(i for i in ids.values() if i >= 0)

    # --- export ------------------------------------------------------------------------------------
    def export(self, manifest: dict, params: dict, out_dir: str) -> dict:
        """One folder ``InternVLForConditionalGeneration.from_pretrained`` loads (``export``)."""
        from entrain.models.families.internvl.export import export

        return export(manifest, params, out_dir)

    # --- profiler ----------------------------------------------------------------------------------
    def reduced_config(self, cfg: InternVLRunConfig, small: InternVLShape) -> InternVLRunConfig:
        return InternVLRunConfig(small, cfg.folder, (1, 1))

    def profile_input(
        self, cfg: InternVLRunConfig, component: str, layer: int, tokens: int, device, per_label: bool
    ):
        from entrain.models.families.internvl.profiling import profile_input

        return profile_input(cfg, component, layer, tokens, device, per_label)


INTERNVL_FAMILY = InternVLFamily()
