"""Export a trained whole Qwen3-VL as ONE Hugging Face folder: the trained parameters (transformers'
names) saved through ``Qwen3VLForConditionalGeneration.save_pretrained`` with the source checkpoint's
config (lm_head untied), and the source folder's other files (tokenizer, processor, chat template,
generation config) copied as they are."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from entrain.models.families.hf_export import load_exactly
from entrain.models.families.qwen3_vl.model import model_class, read_hf_config, untie

__all__ = ["export_folder"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5")
_NOT_COPIED = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json"}


def export_folder(source_dir: str, params: dict[str, torch.Tensor], out_dir: str, *, config=None,
                  cls: type | None = None) -> list[str]:  # fmt: skip
    """Write ``params`` (every parameter, transformers' names) as a checkpoint of ``source_dir``'s model
    in ``out_dir``; returns the files written. ``config`` / ``cls``: a variant's transformers config
    and class (Qwen3-VL-MoE; default: read as Qwen3-VL)."""
    config = config if config is not None else read_hf_config(source_dir)
    untie(config)
    with torch.device("meta"):
        model = (cls or model_class())(config)
    load_exactly(model, {n: t.detach().cpu() for n, t in params.items()}, f"{source_dir}/config.json")
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in sorted(os.listdir(source_dir)):  # after: the source's generation config wins
        path = os.path.join(source_dir, f)
        if os.path.isfile(path) and f not in _NOT_COPIED and not f.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(path, os.path.join(out_dir, f))
    return sorted(str(Path(out_dir) / f) for f in os.listdir(out_dir))
