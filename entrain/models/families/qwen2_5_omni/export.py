"""Export a trained Qwen2.5-Omni thinker as ONE Hugging Face folder of the source's kind: a thinker
source gives a ``Qwen2_5OmniThinkerForConditionalGeneration`` folder; a whole Qwen2.5-Omni source a
whole ``Qwen2_5OmniForConditionalGeneration`` folder whose thinker is the trained one and whose talker
and token2wav are the source's tensors as they were (so the exported model still speaks). The
thinker's lm_head is written untied; the source folder's other files (tokenizer, processor, chat
template, the speakers' ``spk_dict.pt``) are copied as they are."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from entrain.models.families.hf_export import load_exactly
from entrain.models.families.qwen2_5_omni.model import WHOLE, model_class, read_hf_config, untie

__all__ = ["export_folder"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".msgpack", ".h5")
_NOT_COPIED = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json",
               "generation_config.json"}  # fmt: skip


def export_folder(source_dir: str, params: dict[str, torch.Tensor], out_dir: str) -> list[str]:
    """Write ``params`` (every thinker parameter, transformers' names) as a thinker checkpoint of
    ``source_dir``'s model in ``out_dir``; returns the files written."""
    from entrain.models.families.registry import read_config

    config = read_hf_config(source_dir)
    untie(config)
    config.tie_word_embeddings = False
    trained = {n: t.detach().cpu() for n, t in params.items()}
    if read_config(source_dir).get("model_type") == WHOLE:
        model = _whole(source_dir, config, trained)
    else:
        with torch.device("meta"):
            model = model_class()(config)
        load_exactly(model, trained, f"{source_dir}/config.json")
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in sorted(os.listdir(source_dir)):
        path = os.path.join(source_dir, f)
        if os.path.isfile(path) and f not in _NOT_COPIED and not f.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(path, os.path.join(out_dir, f))
    return sorted(str(Path(out_dir) / f) for f in os.listdir(out_dir))


def _whole(source_dir: str, thinker_config, trained: dict[str, torch.Tensor]):
    """The whole model of ``source_dir`` with the ``trained`` thinker and the source's other tensors."""
    from transformers import AutoConfig, Qwen2_5OmniForConditionalGeneration

    from entrain.models.families.composition.hf_checkpoint import SafetensorsFolder

    config = AutoConfig.from_pretrained(source_dir, local_files_only=True)
    config.thinker_config = thinker_config
    with torch.device("meta"):
        model = Qwen2_5OmniForConditionalGeneration(config)
    rest = [n for n, _ in model.named_parameters() if not n.startswith("thinker.")]
    params = {**{f"thinker.{n}": t for n, t in trained.items()}, **SafetensorsFolder(source_dir).read(rest)}
    load_exactly(model, params, f"{source_dir}/config.json")
    return model
