"""A plan binds to its checkpoint's content, not its folder's name: ``entrain plan --out`` records a
fingerprint of each checkpoint folder (config.json, preprocessor_config.json, the safetensors headers'
tensor names, shapes and dtypes) and ``train --plan`` refuses a folder whose content differs (the same
name with a wider vision tower), while a copy of the same content under another name trains."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from entrain.cli import train as train_cli
from entrain.cli.main import main
from entrain.core.errors import ConfigError
from entrain.core.safetensors_header import checkpoint_fingerprint


def _save(folder: Path, vision_width: int = 32) -> Path:
    import torch
    from transformers import LlavaOnevisionForConditionalGeneration

    from tests.models.test_llava_onevision import _config

    cfg = _config()
    cfg.vision_config.hidden_size, cfg.vision_config.intermediate_size = vision_width, 2 * vision_width
    torch.manual_seed(0)
    LlavaOnevisionForConditionalGeneration(cfg).save_pretrained(folder)
    return folder


@pytest.fixture
def launched(monkeypatch) -> list:
    specs = []
    monkeypatch.setattr(train_cli, "_launch", lambda args, spec, nproc: specs.append(spec) or 0)
    return specs


def _plan(tmp_path: Path, ckpt: Path) -> Path:
    out = tmp_path / "plan.json"
    argv = ["plan", "--model-path", str(ckpt), "--dataset", "skewed", "--gpus", "2", "--global-batch", "4",
            "--microbatch-size", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    return out


def test_a_folder_changed_under_the_same_name_is_refused(tmp_path, capsys, launched):
    ckpt = _save(tmp_path / "ckpt")
    plan = _plan(tmp_path, ckpt)
    assert json.loads(plan.read_text())["checkpoint_fingerprint"] == {
        "model_path": checkpoint_fingerprint(ckpt)
    }
    shutil.rmtree(ckpt)
    _save(ckpt, vision_width=64)  # the same folder name, a vision tower twice as wide
    capsys.readouterr()
    assert main(["train", "--plan", str(plan), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert (
        f"was made for the checkpoint {ckpt.resolve()}" in lines[0]
        and f"--model-path {ckpt.resolve()}" in lines[0]
    )
    assert "holds other content" in lines[0] and launched == []


def test_a_copy_of_the_same_content_trains(tmp_path, launched):
    ckpt = _save(tmp_path / "ckpt")
    plan = _plan(tmp_path, ckpt)
    copy = shutil.copytree(ckpt, tmp_path / "elsewhere")
    assert (
        main(["train", "--plan", str(plan), "--model-path", str(copy), "--out", str(tmp_path / "run")]) == 0
    )
    assert launched[0].model.model_path == str(copy)


def test_the_fingerprint_reads_content_not_layout(tmp_path):
    """JSON spacing and key order and how tensors are sharded do not count; a processor value does."""
    ckpt = _save(tmp_path / "ckpt")
    base = checkpoint_fingerprint(ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(dict(reversed(config.items()))))
    assert checkpoint_fingerprint(ckpt) == base
    from safetensors.torch import load_file, save_file

    tensors = load_file(ckpt / "model.safetensors")
    names = sorted(tensors)
    (ckpt / "model.safetensors").unlink()
    save_file({k: tensors[k] for k in names[::2]}, ckpt / "a.safetensors")
    save_file({k: tensors[k] for k in names[1::2]}, ckpt / "b.safetensors")
    assert checkpoint_fingerprint(ckpt) == base
    (ckpt / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5, 0.5, 0.5]}))
    assert checkpoint_fingerprint(ckpt) != base
    (ckpt / "config.json").write_text("{")
    with pytest.raises(ConfigError, match="config.json: cannot read it"):
        checkpoint_fingerprint(ckpt)


def test_a_plan_for_a_checkpoint_does_not_train_a_preset(tmp_path, capsys, launched):
    plan = _plan(tmp_path, _save(tmp_path / "ckpt"))
    capsys.readouterr()
    assert (
        main(["train", "--plan", str(plan), "--model", "llava-ov-tiny", "--out", str(tmp_path / "run")]) == 2
    )
    err = capsys.readouterr().err
    assert (
        f"was made for the checkpoint {(tmp_path / 'ckpt').resolve()} (--model-path)" in err
        and launched == []
    )
