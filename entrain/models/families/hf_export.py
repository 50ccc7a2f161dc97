"""What every family's whole-model export shares: loading the trained tensors into transformers' own
class, built on the meta device, exactly (same parameter names, or one ``ConfigError``); and, for the
families whose export is one folder of a ``...ForConditionalGeneration`` (InternVL, LLaVA-OneVision),
writing that folder with the source folder's other files (``save_whole``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from entrain.core.errors import ConfigError

__all__ = ["load_exactly", "WEIGHT_SUFFIXES", "copy_source_files", "save_whole"]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json", ".msgpack", ".h5")
"""Files of the source folder that are weights (never copied: the export writes its own)."""


def load_exactly(model, params: dict, source: str) -> None:
    """Assign ``params`` to ``model``'s parameters; ``ConfigError`` naming ``source`` (the checkpoint the
    model was built from) when the names differ from the model's."""
    expected = {n for n, _ in model.named_parameters()}
    if set(params) != expected:
        missing, extra = sorted(expected - set(params)), sorted(set(params) - expected)
        raise ConfigError(
            f"the checkpoint's parameters do not match {source} (missing {missing[:3]}, unexpected {extra[:3]})"
        )
    model.load_state_dict(params, strict=False, assign=True)


def copy_source_files(folder: str, out: str) -> list[str]:
    """Copies of every plain file of ``folder`` but config.json and the weights (tokenizer, image
    processor, chat template, generation config), as written under ``out``."""
    copied = []
    for name in sorted(os.listdir(folder)):
        src = os.path.join(folder, name)
        if name == "config.json" or name.endswith(WEIGHT_SUFFIXES) or not os.path.isfile(src):
            continue
        shutil.copy2(src, os.path.join(out, name))
        copied.append(str(Path(out) / name))
    return copied


def save_whole(
    model_class, config, params: dict, source: str, out: str, extra_files: Callable[[str], list[str]]
):
    """Write ``params`` (float32) as a ``model_class`` checkpoint of ``config`` (untied here: the
    embedding and lm_head trained apart) in folder ``out``, after ``extra_files(out)`` wrote the
    folder's other files (``save_pretrained``'s own files win); ``source`` names the model in a
    mismatch error. Returns every file of ``out``, sorted."""
    import torch

    config.tie_word_embeddings = False
    config.text_config.tie_word_embeddings = False
    with torch.device("meta"):
        model = model_class(config)
    load_exactly(model, {n: t.float() for n, t in params.items()}, source)
    Path(out).mkdir(parents=True, exist_ok=True)
    copied = extra_files(out)
    model.save_pretrained(out, safe_serialization=True)
    written = [str(Path(out) / f) for f in os.listdir(out)]
    return sorted(set(written + copied))
