"""The ``qwen3_vl_moe`` model family: whole Qwen3-VL-MoE checkpoints (``--model-path DIR``), or (``plan``
/ ``simulate`` only) a cost-model preset of ``presets.PRESETS``.

Qwen3-VL's family (tower, DeepStack parts, interleaved M-RoPE positions, vocabulary) with the MoE
decoder: transformers' ``Qwen3VLMoeForConditionalGeneration``, its sparse layers priced by ``spec``,
and the ``router_stats`` message part when the checkpoint's loss has the auxiliary term
(``model``'s module docstring). Torch-free at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from entrain.core.errors import ConfigError
from entrain.models.families.base import ModelSource
from entrain.models.families.qwen3_vl.family import Qwen3VLConfig, Qwen3VLFamily, reduced_hf_config
from entrain.models.families.qwen3_vl_moe.presets import PRESETS
from entrain.models.families.qwen3_vl_moe.spec import MODEL_TYPES, Qwen3VLMoeShape, claims, shape_of_folder

__all__ = ["FAMILY", "Qwen3VLMoeConfig", "Qwen3VLMoeFamily", "QWEN3_VL_MOE_FAMILY"]

FAMILY = "qwen3_vl_moe"


@dataclass(frozen=True)
class Qwen3VLMoeConfig(Qwen3VLConfig):
    """A run's model: the checkpoint ``folder`` and its ``shape``."""

    family: str = field(default=FAMILY, init=False)

    def layer_names(self, component: str) -> list[str]:
        return QWEN3_VL_MOE_FAMILY.layer_names(self.shape, component)

    @property
    def hf(self):
        """Transformers' config of the checkpoint (``reduced`` applied: ``entrain profile``'s model)."""
        return reduced_hf_config(_hf_config(self.folder), self)


@cache
def _hf_config(folder: str):
    from entrain.models.families.qwen3_vl_moe.model import read_hf_config

    return read_hf_config(folder)


class Qwen3VLMoeFamily(Qwen3VLFamily):
    """Qwen3-VL's family with the mixture-of-experts decoder."""

    accepts_video = False
    """Video records are not tried on the mixture-of-experts model yet: refused, naming the record."""
    name = FAMILY
    config_class = Qwen3VLMoeConfig
    description = (
        "whole Qwen3-VL-MoE checkpoints: routed experts, dense mlp_only_layers, the auxiliary "
        "load-balancing loss (--model-path; qwen3vl-30b-a3b: cost model only)"
    )

    def preset_names(self) -> tuple[str, ...]:
        return tuple(PRESETS)

    def code_names(self) -> tuple[str, ...]:
        return (self.name, *MODEL_TYPES, "Qwen3VLMoe")

    def claims_config(self, config: dict) -> bool:
        return claims(config)

    def model_types(self) -> tuple[str, ...]:
        return MODEL_TYPES

    def shape(self, source: ModelSource) -> Qwen3VLMoeShape:
        if source.model_path is None:
            if source.preset in PRESETS:
                return PRESETS[source.preset]
            raise ConfigError(
                f"model family {self.name!r} takes a checkpoint folder (--model-path DIR) or a cost-model "
                f"preset ({', '.join(PRESETS)}), not {source.preset!r}"
            )
        return shape_of_folder(source.model_path)

    def build_model(self, cfg: Qwen3VLMoeConfig, *, seed=0, weights_dir=None, dtype=None, stages=None):
        import copy

        from entrain.models.families.qwen3_vl_moe.model import build_model

        if weights_dir is not None:
            raise ConfigError("--weights and --model-path both give the weights: pass one")
        model = build_model(cfg.folder, stages=stages, hf_config=copy.deepcopy(cfg.hf))
        model.entrain_family = self.name
        model.cfg = cfg
        return model

    def build_stage(self, model, component: str, first: int, end: int):
        from entrain.models.families.qwen3_vl_moe.model import build_stage

        stage = build_stage(model, component, first, end)
        stage.entrain_family = self.name
        return stage

    def export(self, manifest: dict, params: dict, out_dir: str) -> dict:
        from entrain.models.families.qwen3_vl.export import export_folder
        from entrain.models.families.qwen3_vl_moe.model import model_class, read_hf_config

        folder = (manifest.get("model_source") or {}).get("model_path")
        if not folder:
            raise ConfigError("the checkpoint manifest names no model_path (the run's --model-path)")
        files = export_folder(folder, params, out_dir, config=read_hf_config(folder), cls=model_class())
        return {"model_dir": str(out_dir), "vision": str(out_dir), "llm": str(out_dir),
                "image_token_id": int(_hf_config(folder).image_token_id), "files": files}  # fmt: skip


QWEN3_VL_MOE_FAMILY = Qwen3VLMoeFamily()
