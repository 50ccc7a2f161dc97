"""An export loads in transformers: every folder ``entrain export`` wrote, with the class its
``config.json`` names (``architectures``), no missing, unexpected or mismatched tensor; the source
checkpoint's tokenizer and processor files come along unchanged; the trained tensors moved, and a
tower frozen by ``--freeze vit`` did not."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import torch

SHIPPED = ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json")


def hf_class(folder: Path):
    import transformers

    name = json.loads((folder / "config.json").read_text())["architectures"][0]
    if hasattr(transformers, name):
        return getattr(transformers, name)
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl

    return getattr(modeling_qwen2_5_vl, name)  # the composition's vision tower


def load_exactly(folder: Path):
    cls = hf_class(folder)
    if hasattr(cls, "load_speakers"):  # whole Qwen2.5-Omni: its from_pretrained cannot return loading info
        model = cls.from_pretrained(folder)  # (saved under older names): one tensor per state entry
        assert len(tensors(folder)) == len(model.state_dict()), folder
        return model
    model, info = cls.from_pretrained(folder, output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    assert not bad, f"{folder}: {bad}"
    return model


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in glob.glob(f"{folder}/*.safetensors"):
        out.update(load_file(f))
    return out


def _by_suffix(source: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The source tensor of an exported vision-only name (a whole checkpoint prefixes ``model.visual.``)."""
    found = [v for k, v in source.items() if k == name or k.endswith("visual." + name)]
    assert len(found) == 1, name
    return found[0]


def _check_tower(spec: dict, exported: Path) -> None:
    before, after = tensors(Path(spec["vision_model"])), tensors(exported)
    frozen = "vit" in spec["freeze"]
    for name, value in after.items():
        same = torch.equal(value, _by_suffix(before, name))
        assert same == (frozen and not name.startswith("merger.")), (
            f"{name}: unchanged={same}, frozen={frozen}"
        )


def _check_llm(folder: Path, model) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert "<|image_pad|>" in tokenizer.get_vocab()
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)


def _check_image_token(hf: Path, model) -> None:
    """The exported tokenizer's ``<|image_pad|>`` (Qwen's image token) is the id the config names."""
    from transformers import AutoTokenizer

    image_token_id = getattr(model.config, "image_token_id", None)
    if image_token_id is None or not (hf / "tokenizer_config.json").is_file():
        return
    tokenizer = AutoTokenizer.from_pretrained(hf)
    if "<|image_pad|>" in tokenizer.get_vocab():
        assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == image_token_id


def check_export(run: Path, hf: Path) -> None:
    """``hf`` (``entrain export RUN --out hf``) loads; see the module docstring."""
    spec = json.loads((run / "config.json").read_text())["spec"] if (run / "config.json").is_file() else None
    if (hf / "config.json").is_file():  # one whole checkpoint
        model = load_exactly(hf)
        source = Path(spec["model_path"]) if spec and spec.get("model_path") else None
        if source is not None:
            for name in SHIPPED:
                if (source / name).is_file():
                    assert (hf / name).read_bytes() == (source / name).read_bytes(), name
            _check_image_token(hf, model)
            trained = tensors(hf)
            assert any(not torch.equal(v, trained[k]) for k, v in tensors(source).items() if k in trained)
        return model
    load_exactly(hf / "vision")
    llm = load_exactly(hf / "llm")
    if spec and spec.get("llm_model"):  # a stock LLM's tokenizer is exported beside it (a preset has none)
        _check_llm(hf / "llm", llm)
    if spec and spec.get("vision_model"):
        _check_tower(spec, hf / "vision")
    return None
