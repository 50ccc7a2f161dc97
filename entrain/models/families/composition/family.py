"""The composition family: a Qwen2-VL / Qwen2.5-VL vision tower feeding a Llama- or Qwen2-structured
causal LM with 1-D positions restarting per packed sample.

Sources: a preset (``entrain.core.model.architectures.MODEL_PRESETS``: ``tiny``, ``qwen25vl-llama3-1b``,
...) or two stock folders (``--vision-model`` + ``--llm-model``, read by ``spec``). This module is
torch-free at import time: the torch parts (``model``, ``hf_checkpoint``, ``tp``, ``profiling``,
``export``) are imported inside the methods.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from entrain.core.errors import ConfigError
from entrain.core.model.architectures import MODEL_PRESETS, ModelArch
from entrain.models.families.base import FamilyBase, ModelSource
from entrain.models.families.composition.config import FAMILY
from entrain.models.families.qwen2_vl import processing as qwen2_vl_processing

if TYPE_CHECKING:
    import torch
    from torch import nn

    from entrain.core.workload.samples import SampleMeta
    from entrain.models.families.composition.config import VLMConfig

__all__ = ["CompositionFamily", "COMPOSITION_FAMILY"]


class CompositionFamily(qwen2_vl_processing.Qwen2VLProcessing, FamilyBase):
    """The vision tower is Qwen2-VL's: its tokens, chat and image processor (``qwen2_vl.processing``)."""

    name = FAMILY
    description = "a Qwen2-VL / Qwen2.5-VL vision tower + a Llama / Qwen2 causal LM (--model presets, --vision-model + --llm-model)"

    # --- plain numbers ----------------------------------------------------------------------------
    def preset_names(self) -> tuple[str, ...]:
        return tuple(MODEL_PRESETS)

    def code_names(self) -> tuple[str, ...]:
        return (self.name, "qwen2_5_vl", "qwen2_vl", "Qwen2_5", "Qwen2VL", "Qwen2_VL", "Llama")

    def shape(self, source: ModelSource) -> ModelArch:
        from entrain.models.families.composition.spec import composition_arch

        return composition_arch(source)

    def layer_names(self, shape: ModelArch, component: str) -> list[str]:
        if component == "encoder":
            return ["patch_embed", *(f"blocks.{i}" for i in range(shape.vision.depth)), "merger"]
        if component == "llm":
            n = shape.llm.num_hidden_layers
            return ["embed_tokens", *(f"layers.{i}" for i in range(n)), "norm", "lm_head", "loss"]
        raise ConfigError(f"unknown component {component!r}; expected 'encoder' or 'llm'")

    def image_rule(self, shape: ModelArch, min_pixels: int | None, max_pixels: int | None):
        """Qwen2-VL's ``smart_resize`` rule at the vision tower's own patch geometry (``patch_size`` x
        ``spatial_merge_size`` pixels per LLM token, ``temporal_patch_size`` frames per patch) within
        ``--min-pixels`` / ``--max-pixels``, else the checkpoint's processor limits, else Qwen's."""
        from entrain.core.workload.samples import pixel_limits

        v = shape.vision
        lo = v.min_pixels if min_pixels is None else min_pixels
        hi = v.max_pixels if max_pixels is None else max_pixels
        return replace(
            pixel_limits(lo, hi),
            factor=v.patch_size * v.spatial_merge_size,
            merge_size=v.spatial_merge_size,
            temporal_patch_size=v.temporal_patch_size,
        )

    def check_tp(self, shape: ModelArch, tp: int) -> None:
        from entrain.models.families.composition.tp import check_tp

        check_tp(shape, tp)

    # --- runtime ---------------------------------------------------------------------------------
    def runtime_config(self, source: ModelSource, shape: ModelArch | None = None) -> tuple[VLMConfig, Any]:
        from entrain.models.families.composition.config import VLMConfig, get_model_config

        if shape is not None:
            return VLMConfig(arch=shape, vision_dir=source.vision_model, llm_dir=source.llm_model), None
        if not source.is_stock:
            return get_model_config(source.preset), None
        return _stock_config(source, self.shape(source))

    def build_model(self, cfg: VLMConfig, *, seed=0, weights_dir=None, dtype=None, stages=None) -> nn.Module:
        import torch

        from entrain.models.families.composition.model import build_vlm

        dtype = torch.float32 if dtype is None else dtype
        return build_vlm(cfg, seed=seed, weights_dir=weights_dir, dtype=dtype, stages=stages)

    def empty_model(self, cfg: VLMConfig) -> nn.Module:
        from entrain.models.families.composition.model import VLM

        return VLM(cfg)

    def build_stage(self, model: nn.Module, component: str, first: int, end: int) -> nn.Module:
        from entrain.models.families.composition.model import build_stage

        return build_stage(model, component, first, end)

    def set_trainable(self, model: nn.Module, *, encoder=True, merger=True, llm=True) -> None:
        from entrain.models.families.composition.model import set_trainable

        set_trainable(model, encoder=encoder, merger=merger, llm=llm)

    def encoder_output_width(self, stage: nn.Module) -> int:
        vis = stage.vis
        return vis.merger.mlp[-1].out_features if stage.has_merger else vis.config.hidden_size

    def recompute_modules(self, stage: nn.Module, mode: str) -> list[nn.Module]:
        from entrain.models.families.composition.model import EncoderStage

        if mode == "none":  # the runtime checked ``mode`` (``entrain.runtime.recompute``)
            return []
        if isinstance(stage, EncoderStage):
            blocks = [stage.vis.blocks[i] for i in stage.block_ids]
            if mode == "selective":
                return [b.attn for b in blocks]
            return blocks + ([stage.vis.merger] if stage.has_merger else [])
        inner = stage.llm.model
        layers = [inner.layers[i] for i in stage.layer_ids]
        if mode == "selective":
            return [layer.self_attn for layer in layers]
        extra = ([inner.norm] if stage.has_norm else []) + ([stage.llm.lm_head] if stage.has_lm_head else [])
        return layers + extra

    def prepare_for_sharding(self, stage: nn.Module) -> None:
        from entrain.models.families.composition.tp import split_fused_qkv

        split_fused_qkv(stage)

    def apply_tp(self, stage: nn.Module, mesh: Any) -> None:
        from entrain.models.families.composition.tp import apply_tp

        apply_tp(stage, mesh)

    def fsdp_units(self, stage: nn.Module) -> list[nn.Module]:
        from entrain.models.families.composition.tp import fsdp_units

        return fsdp_units(stage)

    def checkpoint_parts(self, name: str, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        from entrain.models.families.composition.model import checkpoint_parts

        return checkpoint_parts(name, t)

    def fuse_parts(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        from entrain.models.families.composition.model import fuse_parts

        return fuse_parts(params)

    # --- processing rules --------------------------------------------------------------------------
    def image_grids(self, cfg: VLMConfig, meta: SampleMeta) -> tuple[tuple[int, int, int], ...]:
        """``(1, H'/14, W'/14)`` per image of the ``smart_resize``-d size (a still image)."""
        from entrain.core.workload.samples import smart_resize

        p = cfg.vision.patch_size
        return tuple(
            (1, hr // p, wr // p) for hr, wr in (smart_resize(h, w, meta.vision) for h, w in meta.images)
        )

    def image_feature_rows(self, cfg: VLMConfig, grid: tuple[int, int, int]) -> int:
        t, h, w = grid
        return t * h * w // cfg.vision.spatial_merge_size**2

    def encoder_input_width(self, cfg: VLMConfig) -> int:
        return cfg.vision.patch_dim

    def map_token_id(self, cfg: VLMConfig, qwen_id: int) -> int:
        return cfg.token_id(qwen_id)

    def token_ids(self, cfg: VLMConfig) -> dict[str, int]:
        """The Qwen2 tokenizer's ``<|image_pad|>``, ``<|vision_start|>``, ``<|vision_end|>``, mapped
        onto the LLM's vocabulary (``map_token_id``)."""
        return qwen2_vl_processing.token_ids(lambda qwen_id: self.map_token_id(cfg, qwen_id))

    def processor_folder(self, cfg: VLMConfig) -> str | None:
        """The vision folder (its ``preprocessor_config.json``; None: a preset)."""
        return cfg.vision_dir

    # --- profiler, export --------------------------------------------------------------------------
    def representative_config(self, cfg: VLMConfig):
        from entrain.models.families.composition.profiling import representative_config

        return representative_config(cfg)

    def profile_input(self, cfg: VLMConfig, component: str, layer: int, tokens: int, device, per_label: bool):
        from entrain.models.families.composition.profiling import profile_input

        return profile_input(cfg, component, layer, tokens, device, per_label)

    def export(self, manifest: dict, params: dict, out_dir: str) -> dict:
        from entrain.models.families.composition.export import export

        return export(manifest, params, out_dir)


def _stock_config(source: ModelSource, arch: ModelArch) -> tuple[VLMConfig, Any]:
    """A stock LLM's tokenizer (``entrain.data.tokenizer.model_tokenizer``), the vocabulary grown by the
    tokens it had to add (new embedding rows: ``hf_checkpoint``) and the Qwen2 image ids the renderer
    uses mapped onto the tokenizer's ids."""
    from entrain.data.tokenizer import QWEN2_SPECIAL_TOKENS, model_tokenizer
    from entrain.models.families.composition.config import QWEN2_SPECIAL_BASE, VLMConfig

    tok = model_tokenizer(source.tokenizer, source.llm_model, arch.llm.vocab_size)
    vocab = max(arch.llm.vocab_size, len(tok))
    arch = replace(arch, llm=replace(arch.llm, vocab_size=vocab))
    special = tuple(
        (qid, tok.special_tokens[name])
        for name, qid in QWEN2_SPECIAL_TOKENS.items()
        if qid >= QWEN2_SPECIAL_BASE and name in tok.special_tokens
    )
    cfg = VLMConfig(arch=arch, vision_dir=source.vision_model, llm_dir=source.llm_model, special_ids=special)
    return cfg, tok


COMPOSITION_FAMILY = CompositionFamily()
