"""The model families the runtime tests parametrize over, beyond the composition's ``--model tiny``:
the flags of a tiny model of each (a saved checkpoint folder, or a preset)."""

from __future__ import annotations

from pathlib import Path

FAMILY_MODELS = ("qwen2_vl", "llava_onevision")
"""``qwen2_vl``: a whole Qwen2-VL checkpoint (its own vision tower: LayerNorm, fc1/fc2 MLP; a
Qwen2.5-VL checkpoint runs the composition's tower, which the composition's tests cover);
``llava_onevision``: the ``llava-ov-tiny`` preset."""


def family_flags(family: str, folder: Path) -> dict:
    """``train`` flags of a tiny model of ``family`` (a Qwen checkpoint is saved under ``folder``:
    2 vision blocks, 2 decoder layers, tied embeddings)."""
    if family == "llava_onevision":
        return {"model": "llava-ov-tiny"}
    from tests.models.qwen_vl_tiny import save_whole

    path = save_whole(folder, family, text_layers=2, vision_depth=2, tied=True)
    return {"model_path": str(path)}
