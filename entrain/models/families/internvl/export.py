"""``entrain export`` of InternVL: ONE Hugging Face folder ``DIR`` that
``InternVLForConditionalGeneration.from_pretrained`` loads.

    DIR/config.json + model.safetensors   the trained model, untied (embedding and lm_head train apart)
    DIR/<processor and tokenizer files>   copied from the --model-path folder

The config is the checkpoint folder's own with ``tie_word_embeddings`` false.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from entrain.core.errors import ConfigError
from entrain.models.families.hf_export import load_exactly
from entrain.models.families.llava_onevision.export import WEIGHT_SUFFIXES

__all__ = ["export"]


def export(manifest: dict, params: dict[str, torch.Tensor], out: str) -> dict:
    """``ModelFamily.export``: ``image_token_id``, ``files``, and ``vision`` = ``llm`` = the one folder
    (the export schema's required folder fields; the whole model holds both)."""
    from transformers import InternVLForConditionalGeneration

    from entrain.models.families.internvl.model import read_config

    folder = (manifest.get("model_source") or {}).get("model_path")
    if folder is None:
        raise ConfigError(
            f"the run's model {manifest.get('model')!r} has no checkpoint folder (--model-path)"
        )
    config = read_config(folder)
    config.tie_word_embeddings = False
    config.text_config.tie_word_embeddings = False
    with torch.device("meta"):
        model = InternVLForConditionalGeneration(config)
    load_exactly(model, {n: t.float() for n, t in params.items()}, folder)
    Path(out).mkdir(parents=True, exist_ok=True)
    copied = _processor_files(folder, out)
    model.save_pretrained(out, safe_serialization=True)
    written = [str(Path(out) / f) for f in os.listdir(out)]
    return {
        "vision": str(out),
        "llm": str(out),
        "image_token_id": int(config.image_token_id),
        "files": sorted(set(written + copied)),
    }


def _processor_files(folder: str, out: str) -> list[str]:
    """Copies of the folder's plain files but config.json and the weights (tokenizer, image processor,
    chat template, generation config), as written under ``out``."""
    names = [
        n
        for n in sorted(os.listdir(folder))
        if os.path.isfile(os.path.join(folder, n)) and n != "config.json" and not n.endswith(WEIGHT_SUFFIXES)
    ]
    for n in names:
        shutil.copy2(os.path.join(folder, n), os.path.join(out, n))
    return [str(Path(out) / n) for n in names]
