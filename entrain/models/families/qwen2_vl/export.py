"""Export a trained whole Qwen2-VL / Qwen2.5-VL as ONE Hugging Face folder.

``export_folder`` writes the trained parameters (transformers' own names) with the source
checkpoint's ``config.json`` through the family's ``...ForConditionalGeneration.save_pretrained``,
so ``from_pretrained`` loads it; the lm_head is written untied (embedding and lm_head were trained
apart). The source folder's other files — tokenizer, processor, chat template, generation config —
are copied as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from entrain.models.families.hf_export import copy_source_files, load_exactly
from entrain.models.families.qwen2_vl.model import conditional_generation_class, read_hf_config, untie

__all__ = ["export_folder"]


def export_folder(source_dir: str, params: dict[str, torch.Tensor], out_dir: str) -> list[str]:
    """Write ``params`` (every parameter of the model, transformers' names) as a checkpoint of
    ``source_dir``'s model in ``out_dir``; returns the files written."""
    config = read_hf_config(source_dir)
    untie(config)
    with torch.device("meta"):
        model = conditional_generation_class(config.model_type)(config)
    load_exactly(model, {n: t.detach().cpu() for n, t in params.items()}, f"{source_dir}/config.json")
    model.save_pretrained(out_dir, safe_serialization=True)
    copy_source_files(source_dir, out_dir)  # after: the source's generation config wins over the default one
    return sorted(str(Path(out_dir) / f) for f in os.listdir(out_dir))
