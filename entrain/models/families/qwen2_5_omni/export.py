"""Export a trained Qwen2.5-Omni thinker as ONE Hugging Face folder: the trained parameters
(transformers' names) saved through ``Qwen2_5OmniThinkerForConditionalGeneration.save_pretrained``
with the source checkpoint's thinker config (lm_head untied), and the source folder's other files
(tokenizer, processor, chat template) copied as they are. A whole Qwen2.5-Omni source exports its
thinker only (its ``config.json`` is the thinker's)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from entrain.models.families.hf_export import load_exactly
from entrain.models.families.qwen2_5_omni.model import model_class, read_hf_config, untie

__all__ = ["export_folder"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5")
_NOT_COPIED = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json",
               "generation_config.json"}  # fmt: skip


def export_folder(source_dir: str, params: dict[str, torch.Tensor], out_dir: str) -> list[str]:
    """Write ``params`` (every thinker parameter, transformers' names) as a thinker checkpoint of
    ``source_dir``'s model in ``out_dir``; returns the files written."""
    config = read_hf_config(source_dir)
    untie(config)
    config.tie_word_embeddings = False
    with torch.device("meta"):
        model = model_class()(config)
    load_exactly(model, {n: t.detach().cpu() for n, t in params.items()}, f"{source_dir}/config.json")
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in sorted(os.listdir(source_dir)):
        path = os.path.join(source_dir, f)
        if os.path.isfile(path) and f not in _NOT_COPIED and not f.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(path, os.path.join(out_dir, f))
    return sorted(str(Path(out_dir) / f) for f in os.listdir(out_dir))
