"""Cost-model presets of the ``qwen2_5_omni`` family (torch-free): the Qwen2.5-Omni-7B thinker's
published shape (``entrain.core.model.omni``, where its numbers live) for ``plan`` / ``simulate`` with
``--model qwen25-omni-7b``; training needs the checkpoint (``--model-path DIR``)."""

from __future__ import annotations

from entrain.core.model.omni import QWEN25_OMNI_7B, QWEN25_OMNI_7B_THINKER_CONFIG
from entrain.models.families.qwen2_5_omni.spec import MODEL_TYPES, OmniShape, shape_of_config

__all__ = ["PRESETS"]

PRESETS: dict[str, OmniShape] = {
    QWEN25_OMNI_7B: shape_of_config(
        {**QWEN25_OMNI_7B_THINKER_CONFIG, "model_type": MODEL_TYPES[0]},
        f"preset {QWEN25_OMNI_7B}",
        QWEN25_OMNI_7B,
    )
}
