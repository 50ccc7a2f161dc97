"""Loading a checkpoint refuses weights its ``config.json`` does not describe: a config with fewer
layers than the weights once trained a truncated model silently (the extra layers' tensors were never
read). Every family that reads a ``--model-path`` / stock folder names the folder and a few of the
tensors it has no parameter for, in one line; a config with more layers than the weights names the
missing tensor."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from entrain.core.errors import ConfigError
from entrain.models.families.base import ModelSource
from entrain.models.families.registry import family_of_source


def _edit(path: Path, edit) -> None:
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))


def _build(source: ModelSource):
    family = family_of_source(source)
    cfg, _ = family.runtime_config(source)
    return family.build_model(cfg)


def _qwen(family: str):
    def save(folder: Path) -> ModelSource:
        from tests.models.qwen_vl_tiny import save_whole

        return ModelSource(
            model_path=str(save_whole(folder, family, text_layers=2, vision_depth=2, tied=True))
        )

    return save


def _llava(folder: Path) -> ModelSource:
    import torch
    from transformers import LlavaOnevisionForConditionalGeneration

    from tests.models.test_llava_onevision import _config

    torch.manual_seed(0)
    LlavaOnevisionForConditionalGeneration(_config()).save_pretrained(folder)
    return ModelSource(model_path=str(folder))


def _stock(folder: Path) -> ModelSource:
    from tests.models.stock import save_llm, save_tokenizer, save_vision

    tokenizer = str(save_tokenizer(folder / "tokenizer"))
    vision, llm = str(save_vision(folder / "vision")), str(save_llm(folder / "llm"))
    return ModelSource(vision_model=vision, llm_model=llm, tokenizer=tokenizer)


def _fewer_text_layers(cfg: dict) -> None:
    text = cfg.get("text_config") or cfg
    text["num_hidden_layers"] -= 1
    if text.get("layer_types"):
        text["layer_types"] = text["layer_types"][:-1]


def _fewer_vision_blocks(cfg: dict) -> None:
    vision = cfg.get("vision_config") or cfg
    key = "num_hidden_layers" if "num_hidden_layers" in vision else "depth"
    vision[key] -= 1


CASES = {  # case: (save a checkpoint, the config file to edit, the edit, a tensor named in the error)
    "qwen2_vl text": (_qwen("qwen2_vl"), "config.json", _fewer_text_layers, "layers.1."),
    "qwen2_vl vision": (_qwen("qwen2_vl"), "config.json", _fewer_vision_blocks, "blocks.1."),
    "qwen2_5_vl text": (_qwen("qwen2_5_vl"), "config.json", _fewer_text_layers, "layers.1."),
    "llava_onevision text": (_llava, "config.json", _fewer_text_layers, "layers.3."),
    "llava_onevision vision": (_llava, "config.json", _fewer_vision_blocks, "layers.2."),
    "composition llm": (_stock, "llm/config.json", _fewer_text_layers, "layers.1."),
    "composition vision": (_stock, "vision/config.json", _fewer_vision_blocks, "blocks.1."),
}


@pytest.mark.parametrize("case", CASES)
def test_a_config_with_fewer_layers_than_its_weights_is_refused(tmp_path, case):
    import shutil

    save, config, edit, tensor = CASES[case]
    saved = save(tmp_path / "saved")
    _build(saved)  # as saved: loads
    shutil.copytree(tmp_path / "saved", tmp_path / "ckpt")  # (a folder's config is read once a process)
    moved = {k: getattr(saved, k).replace(str(tmp_path / "saved"), str(tmp_path / "ckpt"))
             for k in ("model_path", "vision_model", "llm_model", "tokenizer") if getattr(saved, k)}  # fmt: skip
    source = replace(saved, **moved)
    _edit(tmp_path / "ckpt" / config, edit)
    with pytest.raises(ConfigError) as err:
        _build(source)
    message = str(err.value)
    folder = str((tmp_path / "ckpt" / config).parent)
    assert "\n" not in message and message.startswith(f"{folder}: ") and tensor in message, message
    assert "config.json has no parameter for" in message


def test_a_config_with_more_layers_than_its_weights_names_the_missing_tensor(tmp_path):
    source = _qwen("qwen2_5_vl")(tmp_path / "ckpt")
    more = {"num_hidden_layers": 3, "layer_types": ["full_attention"] * 3}
    _edit(tmp_path / "ckpt" / "config.json", lambda cfg: cfg["text_config"].update(more))
    with pytest.raises(ConfigError, match="the checkpoint has no tensor for .*layers.2"):
        _build(source)
