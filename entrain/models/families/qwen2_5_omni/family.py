"""The ``qwen2_5_omni`` model family: Qwen2.5-Omni thinker checkpoints (``--model-path DIR``: a thinker
folder, or a whole Qwen2.5-Omni folder whose thinker is trained).

Torch-free at import time: ``model``, ``positions`` and ``export`` (torch, transformers) are imported
inside the methods. The audio tower runs on the first encoder stage beside the vision tower
(``model``'s module docstring has the stage layout and the message parts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from entrain.core.errors import ConfigError
from entrain.models.families.base import FamilyBase, FolderConfig, ModelSource
from entrain.models.families.qwen2_5_omni.presets import PRESETS
from entrain.models.families.qwen2_5_omni.spec import (
    ENCODER_PARTS,
    MODEL_TYPES,
    OmniShape,
    claims,
    shape_of_folder,
)
from entrain.models.families.qwen2_vl.family import QWEN2_SPECIAL_BASE, Qwen2VLFamily

if TYPE_CHECKING:
    import torch
    from torch import nn

    from entrain.models.families.base import PackedSample

__all__ = ["FAMILY", "OmniConfig", "Qwen25OmniFamily", "QWEN2_5_OMNI_FAMILY"]

FAMILY = "qwen2_5_omni"
_PINNED = {151_646: "audio_token_id", 151_647: "audio_start_token_id", 151_648: "audio_end_token_id",
           151_652: "vision_start_token_id", 151_653: "vision_end_token_id", 151_655: "image_token_id",
           151_656: "video_token_id"}  # fmt: skip
"""Qwen2 tokenizer ids of the multimodal tokens -> the thinker config's attribute holding the model's id."""


@dataclass(frozen=True)
class OmniConfig(FolderConfig):
    """A run's model: the checkpoint ``folder`` and its ``shape``."""

    shape: OmniShape
    family: str = field(default=FAMILY, init=False)

    def layer_names(self, component: str) -> list[str]:
        return QWEN2_5_OMNI_FAMILY.layer_names(self.shape, component)

    @property
    def hf(self):
        """Transformers' thinker config of the checkpoint."""
        return _hf_config(self.folder)


@cache
def _hf_config(folder: str):
    from entrain.models.families.qwen2_5_omni.model import read_hf_config

    return read_hf_config(folder)


class Qwen25OmniFamily(Qwen2VLFamily):
    """Qwen2.5-VL's layer names, image rule and grids hold as they are (the thinker's vision tower is
    Qwen2.5-VL's); the model, stages, shapes, vocabulary, positions and export are the thinker's."""

    name = FAMILY
    description = (
        "Qwen2.5-Omni thinker checkpoints: audio + vision towers, time-aligned M-RoPE (--model-path)"
    )

    # --- plain numbers ----------------------------------------------------------------------------
    def preset_names(self) -> tuple[str, ...]:
        return tuple(PRESETS)

    def code_names(self) -> tuple[str, ...]:
        return (self.name, *MODEL_TYPES, "Qwen2_5Omni", "Qwen25Omni")

    def claims_config(self, config: dict) -> bool:
        return claims(config)

    def model_types(self) -> tuple[str, ...]:
        return MODEL_TYPES

    def shape(self, source: ModelSource) -> OmniShape:
        if source.model_path is None:
            if source.preset in PRESETS:
                return PRESETS[source.preset]
            raise ConfigError(
                f"model family {self.name!r} takes a checkpoint folder (--model-path DIR) or a cost-model "
                f"preset ({', '.join(PRESETS)}), not {source.preset!r}"
            )
        return shape_of_folder(source.model_path)

    def check_tp(self, shape: OmniShape, tp: int) -> None:
        FamilyBase.check_tp(self, shape, tp)  # no tensor-parallel plan (yet)

    # --- runtime ---------------------------------------------------------------------------------
    def runtime_config(self, source: ModelSource, shape: OmniShape | None = None) -> tuple[OmniConfig, Any]:
        from entrain.data.tokenizer import has_tokenizer_files, load_tokenizer

        if source.model_path is None:
            raise ConfigError(
                f"--model {source.preset}: a cost-model preset (plan / simulate); to run the model, pass "
                "its checkpoint folder with --model-path DIR"
            )
        full = self.shape(source)
        if shape is not None and shape != full:
            raise ConfigError(f"model family {self.name!r} has no reduced model (entrain profile)")
        cfg = OmniConfig(folder=source.model_path, shape=full)
        path = source.tokenizer or (source.model_path if has_tokenizer_files(source.model_path) else None)
        return cfg, (load_tokenizer(path) if path else None)

    def build_model(self, cfg: OmniConfig, *, seed=0, weights_dir=None, dtype=None, stages=None) -> nn.Module:
        import copy

        from entrain.models.families.qwen2_5_omni.model import build_model

        if weights_dir is not None:
            raise ConfigError("--weights and --model-path both give the weights: pass one")
        model = build_model(cfg.folder, stages=stages, hf_config=copy.deepcopy(cfg.hf))
        model.entrain_family = self.name
        model.cfg = cfg
        return model

    def empty_model(self, cfg: OmniConfig) -> nn.Module:
        return self.build_model(cfg, stages=[])

    def build_stage(self, model: nn.Module, component: str, first: int, end: int) -> nn.Module:
        from entrain.models.families.qwen2_5_omni.model import build_stage

        stage = build_stage(model, component, first, end)
        stage.entrain_family = self.name
        return stage

    def set_trainable(self, model: nn.Module, *, encoder=True, merger=True, llm=True) -> None:
        from entrain.models.families.qwen2_5_omni.model import set_trainable

        set_trainable(model, encoder=encoder, merger=merger, llm=llm)

    def prepare_for_sharding(self, stage: nn.Module) -> None:
        return None

    def apply_tp(self, stage: nn.Module, mesh: Any) -> None:
        FamilyBase.apply_tp(self, stage, mesh)

    def checkpoint_parts(self, name: str, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        return [(name, t)]

    def fuse_parts(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(params)

    def recompute_modules(self, stage: nn.Module, mode: str) -> list[nn.Module]:
        """``selective``: each block's / layer's attention; ``full``: the stage's vision blocks, merger and
        audio tower, its audio encoder layers (an audio pipeline's stage), or its decoder layers, norm
        and lm_head."""
        if mode == "none":
            return []
        if hasattr(stage, "tower"):  # an audio pipeline's stage (model.OmniAudioStage)
            layers = [stage.tower.layers[i] for i in stage.layer_ids]
            return [layer.self_attn for layer in layers] if mode == "selective" else layers
        if hasattr(stage, "vis"):
            blocks = [stage.vis.blocks[i] for i in stage.block_ids]
            if mode == "selective":
                return [b.attn for b in blocks]
            audio = [stage.audio_tower] if stage.audio_tower is not None else []
            return audio + blocks + ([stage.vis.merger] if stage.has_merger else [])
        inner = stage.llm.model
        layers = [inner.layers[i] for i in stage.layer_ids]
        if mode == "selective":
            return [layer.self_attn for layer in layers]
        extra = ([inner.norm] if stage.has_norm else []) + ([stage.llm.lm_head] if stage.has_lm_head else [])
        return layers + extra

    def fsdp_units(self, stage: nn.Module) -> list[nn.Module]:
        if hasattr(stage, "tower"):
            return [stage.tower.layers[i] for i in stage.layer_ids]
        if hasattr(stage, "vis"):
            return [stage.vis.blocks[i] for i in stage.block_ids]
        return [stage.llm.model.layers[i] for i in stage.layer_ids]

    # --- processing rules --------------------------------------------------------------------------
    accepts_audio = True
    accepts_video = True
    encoder_parts = ENCODER_PARTS

    def video_settings(self, cfg: OmniConfig):
        """The checkpoint's video processor numbers (``video_settings_for`` its folder)."""
        return self.video_settings_for(cfg.folder)

    def video_settings_for(self, folder: str | None):
        """``entrain.data.video.VideoSettings``: the folder's own video processor config where it has
        one, else the Qwen2.5-Omni processor's video defaults (128 to 768 merged tokens a frame, 2 fps;
        its ``preprocessor_config.json`` is the image processor's and feature extractor's)."""
        from entrain.data.video import VideoSettings

        return VideoSettings.from_folder(folder)

    def video_text(
        self, cfg: OmniConfig, tokenizer, grid, audio_tokens: int | None = None, frames=None
    ) -> str:
        """What a ``<video>`` of patch grid ``grid`` becomes, as Qwen2.5-Omni's processor expands it
        (with its audio track of ``audio_tokens`` tokens: video and audio interleaved per
        ``seconds_per_chunk`` of the thinker config, ``entrain.data.video_records.video_text``)."""
        from entrain.data.video_records import video_text

        hf = cfg.hf
        return video_text(
            tokenizer, grid, merge=hf.vision_config.spatial_merge_size, audio_tokens=audio_tokens,
            second_per_grid=self.second_per_grid(cfg),
            position_id_per_seconds=hf.position_id_per_seconds, seconds_per_chunk=hf.seconds_per_chunk,
        )  # fmt: skip

    def second_per_grid(self, cfg: OmniConfig, sampled_fps: float | None = None) -> float:
        """Seconds of a video's temporal patch: the Omni processor's ``temporal_patch_size / fps`` with
        its sampling ``fps`` (2), whatever the video's own rate."""
        return self.video_settings(cfg).second_per_grid

    def token_ids(self, cfg: OmniConfig) -> dict[str, int]:
        hf = cfg.hf
        return {
            "image": int(hf.image_token_id),
            "image_start": int(hf.vision_start_token_id),
            "image_end": int(hf.vision_end_token_id),
            "audio": int(hf.audio_token_id),
            "audio_start": int(hf.audio_start_token_id),
            "audio_end": int(hf.audio_end_token_id),
            "video": int(hf.video_token_id),
        }

    def format_chat(
        self, cfg: OmniConfig, turns, image_tokens, tokenizer, audio_tokens=()
    ) -> tuple[list[int], list[int]]:
        """Qwen2.5-Omni's processor's expansion: each ``<image>`` as ``<|vision_bos|>`` + n x ``<|IMAGE|>``
        + ``<|vision_eos|>`` and each ``<audio>`` as ``<|audio_bos|>`` + n x ``<|AUDIO|>`` +
        ``<|audio_eos|>`` (a Qwen2 tokenizer writes the same ids under its own names: vision start / end
        and image pad; the audio ids through ``map_token_id``), in the tokenizer's chat template when it
        has one, Qwen2's otherwise."""
        from entrain.data.processing import format_chat, vision_markers

        special = getattr(tokenizer, "special_tokens", {})
        image_text = (
            (lambda n: "<|vision_bos|>" + "<|IMAGE|>" * n + "<|vision_eos|>")
            if "<|IMAGE|>" in special
            else vision_markers
        )
        return format_chat(turns, image_tokens, tokenizer, image_text, audio_tokens=audio_tokens)

    def audio_input_width(self, cfg: OmniConfig) -> int:
        """Mel bins of one audio feature frame (the audio tower's ``num_mel_bins``)."""
        return cfg.shape.audio.num_mel_bins

    def map_token_id(self, cfg: OmniConfig, qwen_id: int) -> int:
        """The thinker's vocabulary is Qwen2's: ids stay, but for the multimodal tokens, which take the
        checkpoint's ids; a smaller vocabulary (test checkpoints) folds every other id below them."""
        hf = cfg.hf
        if qwen_id in _PINNED:
            return int(getattr(hf, _PINNED[qwen_id]))
        if cfg.llm.vocab_size > QWEN2_SPECIAL_BASE:
            return qwen_id
        return qwen_id % min(int(getattr(hf, a)) for a in _PINNED.values())

    def position_ids(self, cfg: OmniConfig, samples: list[PackedSample]) -> torch.Tensor:
        """``[3, T]`` time-aligned M-RoPE ids, per sample as transformers' ``get_rope_index``."""
        from entrain.models.families.qwen2_5_omni.positions import mrope_position_ids

        return mrope_position_ids(cfg.hf, samples)

    # --- profiler (no reduced model: every layer timed as itself), export ----------------------------
    def representative_config(self, cfg: OmniConfig):
        return FamilyBase.representative_config(self, cfg)

    def profile_input(
        self, cfg: OmniConfig, component: str, layer: int, tokens: int, device, per_label: bool
    ):
        return FamilyBase.profile_input(self, cfg, component, layer, tokens, device, per_label)

    def export(self, manifest: dict, params: dict, out_dir: str) -> dict:
        from entrain.models.families.qwen2_5_omni.export import export_folder

        folder = (manifest.get("model_source") or {}).get("model_path")
        if not folder:
            raise ConfigError("the checkpoint manifest names no model_path (the run's --model-path)")
        files = export_folder(folder, params, out_dir)
        return {"model_dir": str(out_dir), "vision": str(out_dir), "llm": str(out_dir),
                "image_token_id": int(_hf_config(folder).image_token_id), "files": files}  # fmt: skip


QWEN2_5_OMNI_FAMILY = Qwen25OmniFamily()
