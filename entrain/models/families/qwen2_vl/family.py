"""The ``qwen2_vl`` model family: whole Qwen2-VL / Qwen2.5-VL checkpoints (``--model-path DIR``).

Torch-free at import time: ``model``, ``positions`` and ``export`` (torch, transformers) are imported
inside the methods. Sources: a checkpoint folder, or (``plan`` / ``simulate`` only) a cost-model preset
of ``presets.PRESETS`` (a published shape, no weights).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from entrain.core.errors import ConfigError
from entrain.core.model.architectures import ModelArch
from entrain.models.families.base import FamilyBase, FolderConfig, ModelSource
from entrain.models.families.qwen2_vl.presets import PRESETS
from entrain.models.families.qwen2_vl.processing import Qwen2VLProcessing
from entrain.models.families.qwen2_vl.spec import MODEL_TYPES, claims, shape_of_folder

if TYPE_CHECKING:
    import torch
    from torch import nn

    from entrain.core.workload.samples import SampleMeta
    from entrain.models.families.base import PackedSample

__all__ = ["FAMILY", "QwenVLConfig", "Qwen2VLFamily", "QWEN2_VL_FAMILY"]

FAMILY = "qwen2_vl"
QWEN2_SPECIAL_BASE = 151_643
"""The first Qwen2 special-token id (``<|endoftext|>``); ids at or above it are special."""
_PINNED = {151_652: "vision_start_token_id", 151_653: "vision_end_token_id",
           151_655: "image_token_id", 151_656: "video_token_id"}  # fmt: skip


@dataclass(frozen=True)
class QwenVLConfig(FolderConfig):
    """A run's model: the checkpoint ``folder`` and its ``shape``. ``depths``: ``(vision blocks,
    full-attention block indexes, decoder layers)`` replacing the checkpoint's (the profiler's reduced
    model, built empty)."""

    shape: ModelArch
    depths: tuple[int, tuple[int, ...], int] | None = None
    family: str = field(default=FAMILY, init=False)

    def layer_names(self, component: str) -> list[str]:
        return QWEN2_VL_FAMILY.layer_names(self.shape, component)

    @property
    def hf(self):
        """Transformers' config of the checkpoint (with ``depths`` applied)."""
        return _hf_config(self.folder, self.depths)


@cache
def _hf_config(folder: str, depths):
    from entrain.models.families.qwen2_vl.model import read_hf_config

    config = read_hf_config(folder)
    if depths is not None:
        blocks, full, layers = depths
        config.vision_config.depth = blocks
        if hasattr(config.vision_config, "fullatt_block_indexes"):
            config.vision_config.fullatt_block_indexes = list(full)
        text = config.get_text_config()
        text.num_hidden_layers = layers
        text.layer_types = text.layer_types[:layers]
    return config


class Qwen2VLFamily(Qwen2VLProcessing, FamilyBase):
    name = FAMILY
    description = (
        "whole Qwen2-VL / Qwen2.5-VL checkpoints with M-RoPE (--model-path; qwen25vl-7b: cost model only)"
    )

    # --- plain numbers ----------------------------------------------------------------------------
    def preset_names(self) -> tuple[str, ...]:
        return tuple(PRESETS)

    def code_names(self) -> tuple[str, ...]:
        return (self.name, *MODEL_TYPES, "Qwen2VL", "Qwen2_5_VL", "mrope")

    def claims_config(self, config: dict) -> bool:
        return claims(config)

    def model_types(self) -> tuple[str, ...]:
        return MODEL_TYPES

    def shape(self, source: ModelSource) -> ModelArch:
        if source.model_path is None:
            if source.preset in PRESETS:
                return PRESETS[source.preset]
            raise ConfigError(
                f"model family {self.name!r} takes a checkpoint folder (--model-path DIR) or a cost-model "
                f"preset ({', '.join(PRESETS)}), not {source.preset!r}"
            )
        return shape_of_folder(source.model_path)

    def layer_names(self, shape: ModelArch, component: str) -> list[str]:
        """The composition's (the same vision tower and decoder layer lists)."""
        return _composition().layer_names(shape, component)

    def image_rule(self, shape: ModelArch, min_pixels: int | None, max_pixels: int | None):
        """The composition's rule: ``smart_resize`` at the checkpoint's patch / merge / temporal sizes."""
        return _composition().image_rule(shape, min_pixels, max_pixels)

    def check_tp(self, shape: ModelArch, tp: int) -> None:
        """The composition's tensor-parallel plan (same vision blocks, Qwen2 decoder layers; Qwen2-VL's
        vision MLP ``fc1`` / ``fc2`` column- then row-wise)."""
        from entrain.models.families.composition.tp import check_tp

        check_tp(shape, tp)

    # --- runtime ---------------------------------------------------------------------------------
    def runtime_config(self, source: ModelSource, shape: ModelArch | None = None) -> tuple[QwenVLConfig, Any]:
        """The checkpoint's config; the tokenizer: ``--tokenizer``, else the folder's own files, else
        None (the built-in Qwen2 tokenizer: Qwen2-VL's vocabulary)."""
        from entrain.data.tokenizer import has_tokenizer_files, load_tokenizer

        if source.model_path is None:
            raise ConfigError(
                f"--model {source.preset}: a cost-model preset (plan / simulate); to run the model, pass "
                "its checkpoint folder with --model-path DIR"
            )
        full = self.shape(source)
        depths = None
        if shape is not None and shape != full:  # the profiler's reduced model
            v = shape.vision
            depths = (v.depth, tuple(v.fullatt_block_indexes), shape.llm.num_hidden_layers)
        cfg = QwenVLConfig(folder=source.model_path, shape=shape or full, depths=depths)
        path = source.tokenizer or (source.model_path if has_tokenizer_files(source.model_path) else None)
        return cfg, (load_tokenizer(path) if path else None)

    def build_model(
        self, cfg: QwenVLConfig, *, seed=0, weights_dir=None, dtype=None, stages=None
    ) -> nn.Module:
        from entrain.models.families.qwen2_vl.model import build_model

        if weights_dir is not None:
            raise ConfigError("--weights and --model-path both give the weights: pass one")
        model = build_model(cfg.folder, stages=stages, hf_config=_fresh(cfg), strict=cfg.depths is None)
        model.entrain_family = self.name
        model.cfg = cfg  # the runtime (profiler) reads the run's config off the model
        return model

    def empty_model(self, cfg: QwenVLConfig) -> nn.Module:
        """The model on the meta device, nothing read (the profiler fills it)."""
        from entrain.models.families.qwen2_vl.model import build_model

        model = build_model(cfg.folder, stages=[], hf_config=_fresh(cfg))
        model.entrain_family = self.name
        model.cfg = cfg  # the runtime (profiler) reads the run's config off the model
        return model

    def build_stage(self, model: nn.Module, component: str, first: int, end: int) -> nn.Module:
        from entrain.models.families.qwen2_vl.model import build_stage

        stage = build_stage(model, component, first, end)
        stage.entrain_family = self.name
        return stage

    def set_trainable(self, model: nn.Module, *, encoder=True, merger=True, llm=True) -> None:
        from entrain.models.families.qwen2_vl.model import set_trainable

        set_trainable(model, encoder=encoder, merger=merger, llm=llm)

    def encoder_output_width(self, stage: nn.Module) -> int:
        vis = stage.vis
        if stage.has_merger:
            return vis.merger.mlp[-1].out_features
        return getattr(vis.config, "embed_dim", None) or vis.config.hidden_size

    def recompute_modules(self, stage: nn.Module, mode: str) -> list[nn.Module]:
        """The stages are the composition's stage modules: its recompute blocks apply as they are."""
        return _composition().recompute_modules(stage, mode)

    def prepare_for_sharding(self, stage: nn.Module) -> None:
        """The stages are the composition's stage modules: its fused-qkv split applies as it is."""
        from entrain.models.families.composition.tp import split_fused_qkv

        split_fused_qkv(stage)

    def apply_tp(self, stage: nn.Module, mesh: Any) -> None:
        from entrain.models.families.composition.tp import apply_tp

        apply_tp(stage, mesh)

    def checkpoint_parts(self, name: str, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        from entrain.models.families.composition.model import checkpoint_parts

        return checkpoint_parts(name, t)

    def fuse_parts(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        from entrain.models.families.composition.model import fuse_parts

        return fuse_parts(params)

    def fsdp_units(self, stage: nn.Module) -> list[nn.Module]:
        from entrain.models.families.composition.tp import fsdp_units

        return fsdp_units(stage)

    # --- processing rules --------------------------------------------------------------------------
    # the composition's tower is this family's vision tower: its patch and merge rules apply as they are
    def image_grids(self, cfg: QwenVLConfig, meta: SampleMeta) -> tuple[tuple[int, int, int], ...]:
        """``(1, H'/patch, W'/patch)`` per image of its ``smart_resize``-d size (a still image)."""
        return _composition().image_grids(cfg, meta)

    def image_feature_rows(self, cfg: QwenVLConfig, grid: tuple[int, int, int]) -> int:
        return _composition().image_feature_rows(cfg, grid)

    def encoder_input_width(self, cfg: QwenVLConfig) -> int:
        return _composition().encoder_input_width(cfg)

    def token_ids(self, cfg: QwenVLConfig) -> dict[str, int]:
        hf = cfg.hf
        ids = {
            "image": hf.image_token_id,
            "image_start": hf.vision_start_token_id,
            "image_end": hf.vision_end_token_id,
        }
        return {**ids, "video": hf.video_token_id} if self.accepts_video else ids

    accepts_video = True

    def video_settings(self, cfg: QwenVLConfig):
        """The checkpoint's video processor numbers (``video_settings_for`` its folder)."""
        return self.video_settings_for(getattr(cfg, "folder", None))

    def video_settings_for(self, folder: str | None):
        """``entrain.data.video.VideoSettings`` of a checkpoint folder as transformers' video processor
        loads them (its video processor config, else its ``preprocessor_config.json``); transformers'
        Qwen2-VL defaults without a folder or config."""
        from entrain.data.video import VideoSettings

        return VideoSettings.from_folder(folder, image_config=True)

    def video_text(
        self, cfg: QwenVLConfig, tokenizer, grid, audio_tokens: int | None = None, frames=None
    ) -> str:
        """What a ``<video>`` of patch grid ``grid`` becomes: ``<|vision_start|>`` + its
        ``t*h*w/merge**2`` ``<|video_pad|>`` + ``<|vision_end|>`` (the processor's expansion; ``frames``,
        the kept frame indices and the video's frame rate, are not needed)."""
        from entrain.data.video_records import video_text

        if audio_tokens is not None:
            raise ValueError(f"model family {self.name!r} reads no audio track of a video")
        return video_text(tokenizer, grid, merge=cfg.hf.vision_config.spatial_merge_size)

    def second_per_grid(self, cfg: QwenVLConfig, sampled_fps: float | None = None) -> float:
        """Seconds of a video's temporal patch: Qwen2.5-VL's processor's ``temporal_patch_size /
        sampled fps`` (the frames kept per second of the video; Qwen2-VL's positions ignore it)."""
        s = self.video_settings(cfg)
        return s.temporal_patch_size / (sampled_fps or s.fps)

    def map_token_id(self, cfg: QwenVLConfig, qwen_id: int) -> int:
        """Qwen2-VL's vocabulary is Qwen2's: ids stay, but for the vision tokens, which take the
        checkpoint's ids; a smaller vocabulary (test checkpoints) folds every other id below them."""
        hf = cfg.hf
        if qwen_id in _PINNED:
            return int(getattr(hf, _PINNED[qwen_id]))
        if cfg.llm.vocab_size > QWEN2_SPECIAL_BASE:
            return qwen_id
        return qwen_id % min(int(getattr(hf, a)) for a in _PINNED.values())

    def position_ids(self, cfg: QwenVLConfig, samples: list[PackedSample]) -> torch.Tensor:
        """``[3, T]`` M-RoPE ids, per sample as transformers' ``get_rope_index`` gives them."""
        from entrain.models.families.qwen2_vl.positions import mrope_position_ids

        return mrope_position_ids(cfg.hf, samples)

    # --- profiler, export --------------------------------------------------------------------------
    def representative_config(self, cfg: QwenVLConfig):
        from entrain.models.families.qwen2_vl.profiling import representative_config

        return representative_config(cfg)

    def profile_input(
        self, cfg: QwenVLConfig, component: str, layer: int, tokens: int, device, per_label: bool
    ):
        from entrain.models.families.qwen2_vl.profiling import profile_input

        return profile_input(cfg, component, layer, tokens, device, per_label)

    def export(self, manifest: dict, params: dict, out_dir: str) -> dict:
        """One folder ``out_dir`` that ``...ForConditionalGeneration.from_pretrained`` loads; the
        summary's ``model_dir`` (and ``vision`` / ``llm``, the same folder) name it."""
        from entrain.models.families.qwen2_vl.export import export_folder

        source = manifest.get("model_source") or {}
        folder = source.get("model_path")
        if not folder:
            raise ConfigError("the checkpoint manifest names no model_path (the run's --model-path)")
        files = export_folder(folder, params, out_dir)
        image_token_id = int(_hf_config(folder, None).image_token_id)
        # one folder holds both the vision tower and the language model
        return {"model_dir": str(out_dir), "vision": str(out_dir), "llm": str(out_dir),
                "image_token_id": image_token_id, "files": files}  # fmt: skip


def _fresh(cfg: QwenVLConfig):
    """A copy of ``cfg.hf`` (the model build edits its config)."""
    import copy

    return copy.deepcopy(cfg.hf)


QWEN2_VL_FAMILY = Qwen2VLFamily()


def _composition():
    """The composition family, whose vision tower and stage modules this family reuses."""
    from entrain.models.families.composition.family import COMPOSITION_FAMILY

    return COMPOSITION_FAMILY
