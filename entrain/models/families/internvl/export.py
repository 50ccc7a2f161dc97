"""``entrain export`` of InternVL: ONE Hugging Face folder ``DIR`` that
``InternVLForConditionalGeneration.from_pretrained`` loads.

    DIR/config.json + model.safetensors   the trained model, untied (embedding and lm_head train apart)
    DIR/<processor and tokenizer files>   copied from the --model-path folder

The config is the checkpoint folder's own with ``tie_word_embeddings`` false.
"""

from __future__ import annotations

import functools

import torch

from entrain.core.errors import ConfigError
from entrain.models.families.hf_export import copy_source_files, save_whole

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
    copy = functools.partial(copy_source_files, folder)
    files = save_whole(InternVLForConditionalGeneration, config, params, folder, out, copy)
    return {"vision": str(out), "llm": str(out), "image_token_id": int(config.image_token_id), "files": files}
