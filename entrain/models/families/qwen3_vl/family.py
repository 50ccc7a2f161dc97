"""The ``qwen3_vl`` model family: whole Qwen3-VL checkpoints (``--model-path DIR``), or (``plan`` /
``simulate`` only) a cost-model preset of ``presets.PRESETS``.

Torch-free at import time: ``model``, ``positions`` and ``export`` (torch, transformers) are imported
inside the methods. Stage messages carry named parts: ``hidden`` and one ``deepstack_k`` per DeepStack
tap (``model``'s module docstring says where each is made, forwarded and consumed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from entrain.core.errors import ConfigError
from entrain.models.families.base import FamilyBase, FolderConfig, ModelSource
from entrain.models.families.qwen2_vl.family import Qwen2VLFamily
from entrain.models.families.qwen3_vl.presets import PRESETS
from entrain.models.families.qwen3_vl.spec import MODEL_TYPES, Qwen3VLShape, claims, shape_of_folder

if TYPE_CHECKING:
    import torch
    from torch import nn

    from entrain.models.families.base import PackedSample

__all__ = ["FAMILY", "Qwen3VLConfig", "Qwen3VLFamily", "QWEN3_VL_FAMILY", "reduced_hf_config"]

FAMILY = "qwen3_vl"


@dataclass(frozen=True)
class Qwen3VLConfig(FolderConfig):
    """A run's model: the checkpoint ``folder`` and its ``shape``. ``reduced``: ``entrain profile``'s
    reduced model keeps only these vision blocks and decoder layers (``profiling.representative_config``;
    None: the whole checkpoint)."""

    shape: Qwen3VLShape
    family: str = field(default=FAMILY, init=False)
    reduced: tuple | None = None

    def layer_names(self, component: str) -> list[str]:
        return QWEN3_VL_FAMILY.layer_names(self.shape, component)

    @property
    def hf(self):
        """Transformers' config of the checkpoint (``reduced`` applied)."""
        return reduced_hf_config(_hf_config(self.folder), self)


def reduced_hf_config(config, cfg: Qwen3VLConfig):
    """``config`` with ``cfg.reduced`` applied (``profiling.reduce_hf``), or itself."""
    if cfg.reduced is None:
        return config
    from entrain.models.families.qwen3_vl.profiling import reduce_hf

    return reduce_hf(config, cfg.reduced, tuple(getattr(cfg.shape, "sparse", ())))


@cache
def _hf_config(folder: str):
    from entrain.models.families.qwen3_vl.model import read_hf_config

    return read_hf_config(folder)


class Qwen3VLFamily(Qwen2VLFamily):
    """Qwen2-VL's layer names, image rule and grids (at the checkpoint's 16-px patches) and vocabulary
    (``token_ids``, ``map_token_id``) hold as they are; the model, stages, shapes, positions and export
    are Qwen3-VL's own."""

    videos_among_images = True
    """``position_ids`` takes a sample's videos among its images (``PackedSample.grids``: every visual
    item in order; ``positions.split_videos`` tells them apart by the video token id)."""

    def video_settings_for(self, folder: str | None):
        """``entrain.data.video.VideoSettings`` of the folder as transformers' video processor loads them,
        ``Qwen3VLVideoProcessor``'s defaults (``QWEN3_SETTINGS``) for what it leaves out."""
        from entrain.data.video import QWEN3_SETTINGS, VideoSettings

        return VideoSettings.from_folder(folder, image_config=True, base=QWEN3_SETTINGS)

    def video_text(
        self, cfg: Qwen3VLConfig, tokenizer, grid, audio_tokens: int | None = None, frames=None
    ) -> str:
        """What a ``<video>`` becomes, as ``Qwen3VLProcessor`` expands it: per temporal patch its
        timestamp (``<t seconds>``, from ``frames``: the kept frame indices and the video's frame rate)
        and ``<|vision_start|>`` + ``h*w/merge**2`` ``<|video_pad|>`` + ``<|vision_end|>``, inside the
        chat template's ``<|vision_start|>`` ... ``<|vision_end|>`` (``processing.video_text``)."""
        from entrain.data.video_records import video_markers
        from entrain.models.families.qwen3_vl.processing import video_text

        if audio_tokens is not None:
            raise ValueError(f"model family {self.name!r} reads no audio track of a video")
        if frames is None:
            raise ValueError("a Qwen3-VL video's text needs its kept frames and frame rate (timestamps)")
        start, pad, end = video_markers(tokenizer)
        s = self.video_settings(cfg)
        return video_text(grid, frames[0], frames[1], merge_size=s.merge_size, temporal_patch_size=s.temporal_patch_size,
                          tokens={"start": start, "video": pad, "end": end})  # fmt: skip

    name = FAMILY
    config_class: type = Qwen3VLConfig
    """The run's model config (a variant family's own, whose ``hf`` reads its checkpoint)."""
    description = "whole Qwen3-VL checkpoints with DeepStack and interleaved M-RoPE (--model-path; qwen3vl-8b: cost model only)"

    # --- plain numbers ----------------------------------------------------------------------------
    def preset_names(self) -> tuple[str, ...]:
        return tuple(PRESETS)

    def code_names(self) -> tuple[str, ...]:
        return (self.name, *MODEL_TYPES, "Qwen3VL", "deepstack")

    def claims_config(self, config: dict) -> bool:
        return claims(config)

    def model_types(self) -> tuple[str, ...]:
        return MODEL_TYPES

    def shape(self, source: ModelSource) -> Qwen3VLShape:
        if source.model_path is None:
            if source.preset in PRESETS:
                return PRESETS[source.preset]
            raise ConfigError(
                f"model family {self.name!r} takes a checkpoint folder (--model-path DIR) or a cost-model "
                f"preset ({', '.join(PRESETS)}), not {source.preset!r}"
            )
        return shape_of_folder(source.model_path)

    # --- runtime ---------------------------------------------------------------------------------
    def runtime_config(
        self, source: ModelSource, shape: Qwen3VLShape | None = None
    ) -> tuple[Qwen3VLConfig, Any]:
        from entrain.data.tokenizer import has_tokenizer_files, load_tokenizer

        if source.model_path is None:
            raise ConfigError(
                f"--model {source.preset}: a cost-model preset (plan / simulate); to run the model, pass "
                "its checkpoint folder with --model-path DIR"
            )
        full = self.shape(source)
        if shape is not None and shape != full:
            raise ConfigError(f"model family {self.name!r} has no reduced model (entrain profile)")
        cfg = self.config_class(folder=source.model_path, shape=full)
        path = source.tokenizer or (source.model_path if has_tokenizer_files(source.model_path) else None)
        return cfg, (load_tokenizer(path) if path else None)

    def build_model(
        self, cfg: Qwen3VLConfig, *, seed=0, weights_dir=None, dtype=None, stages=None
    ) -> nn.Module:
        import copy

        from entrain.models.families.qwen3_vl.model import build_model

        if weights_dir is not None:
            raise ConfigError("--weights and --model-path both give the weights: pass one")
        model = build_model(cfg.folder, stages=stages, hf_config=copy.deepcopy(cfg.hf))
        model.entrain_family = self.name
        model.cfg = cfg
        return model

    def empty_model(self, cfg: Qwen3VLConfig) -> nn.Module:
        return self.build_model(cfg, stages=[])

    def build_stage(self, model: nn.Module, component: str, first: int, end: int) -> nn.Module:
        from entrain.models.families.qwen3_vl.model import build_stage

        stage = build_stage(model, component, first, end)
        stage.entrain_family = self.name
        return stage

    def set_trainable(self, model: nn.Module, *, encoder=True, merger=True, llm=True) -> None:
        from entrain.models.families.qwen3_vl.model import set_trainable

        set_trainable(model, encoder=encoder, merger=merger, llm=llm)

    def check_tp(self, shape: Qwen3VLShape, tp: int) -> None:
        FamilyBase.check_tp(self, shape, tp)  # no tensor-parallel plan (yet)

    def prepare_for_sharding(self, stage: nn.Module) -> None:
        return None

    def apply_tp(self, stage: nn.Module, mesh: Any) -> None:
        FamilyBase.apply_tp(self, stage, mesh)

    def checkpoint_parts(self, name: str, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        return [(name, t)]

    def fuse_parts(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(params)

    def encoder_output_width(self, stage: nn.Module) -> int:
        vis = stage.vis
        return vis.config.out_hidden_size if stage.has_merger else vis.config.hidden_size

    def recompute_modules(self, stage: nn.Module, mode: str) -> list[nn.Module]:
        """``selective``: each block's / layer's attention; ``full``: the blocks (with their DeepStack
        mergers), the merger, the decoder layers, norm and lm_head of the stage."""
        if mode == "none":
            return []
        if hasattr(stage, "vis"):
            vis = stage.vis
            blocks = [vis.blocks[i] for i in stage.block_ids]
            if mode == "selective":
                return [b.attn for b in blocks]
            taps = [
                vis.deepstack_merger_list[stage.taps.index(i)] for i in stage.block_ids if i in stage.taps
            ]
            return blocks + taps + ([vis.merger] if stage.has_merger else [])
        inner = stage.llm.model
        layers = [inner.layers[i] for i in stage.layer_ids]
        if mode == "selective":
            return [layer.self_attn for layer in layers]
        extra = ([inner.norm] if stage.has_norm else []) + ([stage.llm.lm_head] if stage.has_lm_head else [])
        return layers + extra

    def fsdp_units(self, stage: nn.Module) -> list[nn.Module]:
        if hasattr(stage, "vis"):
            return [stage.vis.blocks[i] for i in stage.block_ids]
        return [stage.llm.model.layers[i] for i in stage.layer_ids]

    def position_ids(self, cfg: Qwen3VLConfig, samples: list[PackedSample]) -> torch.Tensor:
        """``[3, T]`` interleaved M-RoPE ids, per sample as transformers' ``get_rope_index`` gives them."""
        from entrain.models.families.qwen3_vl.positions import mrope_position_ids

        return mrope_position_ids(cfg.hf, samples)

    # --- profiler: a reduced model, one block / layer per kind (``profiling``) ----------------------
    def representative_config(self, cfg: Qwen3VLConfig):
        from entrain.models.families.qwen3_vl.profiling import representative_config

        return representative_config(cfg)

    def profile_input(
        self, cfg: Qwen3VLConfig, component: str, layer: int, tokens: int, device, per_label: bool
    ):
        from entrain.models.families.qwen3_vl.profiling import profile_input

        return profile_input(cfg, component, layer, tokens, device, per_label)

    # --- export ------------------------------------------------------------------------------------
    def export(self, manifest: dict, params: dict, out_dir: str) -> dict:
        from entrain.models.families.qwen3_vl.export import export_folder

        folder = (manifest.get("model_source") or {}).get("model_path")
        if not folder:
            raise ConfigError("the checkpoint manifest names no model_path (the run's --model-path)")
        files = export_folder(folder, params, out_dir)
        return {"model_dir": str(out_dir), "vision": str(out_dir), "llm": str(out_dir),
                "image_token_id": int(_hf_config(folder).image_token_id), "files": files}  # fmt: skip


QWEN3_VL_FAMILY = Qwen3VLFamily()
