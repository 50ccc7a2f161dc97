"""A checkpoint whose tokenizer writes another id for ``<|image_pad|>`` (or a vision marker) than its
``config.json`` names: every real sample used to pass ``data check`` and ``plan`` and be refused by the
ranks at step 0, after launch. ``check_vision_tokens`` refuses it up front, naming the config file and
the ids on both sides; ``data check --model-path`` and ``train``'s front process run it, and a
checkpoint whose ids agree passes (each family whose tiny checkpoint ships a tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrain.cli import train as train_cli
from entrain.cli.main import main
from entrain.core.errors import ConfigError
from entrain.models.families.base import ModelSource
from entrain.models.families.registry import family_of_source
from entrain.models.families.token_check import PROBE_ROWS, check_vision_tokens


def _qwen(folder: Path, model_type: str = "qwen2_5_vl") -> Path:
    from tests.models.qwen_vl_tiny import save_with_tokenizer

    return save_with_tokenizer(folder, model_type, text_layers=1, vision_depth=1, tied=True)


def _qwen3(folder: Path) -> Path:
    from tests.models.qwen3_vl_tiny import save_with_tokenizer

    return save_with_tokenizer(folder, text_layers=3, vision_depth=4)


def _internvl(folder: Path) -> Path:
    from tests.models.internvl_tiny import save_internvl

    return save_internvl(folder)


def _check(folder: Path) -> None:
    source = ModelSource(model_path=str(folder))
    family = family_of_source(source)
    cfg, tokenizer = family.runtime_config(source)
    assert tokenizer is not None  # the folder's own tokenizer: what train renders with
    check_vision_tokens(family, cfg, tokenizer)


def _set(folder: Path, **ids: int) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(ids)
    path.write_text(json.dumps(config))


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> Path:
    return _qwen(tmp_path_factory.mktemp("qwen25vl"))


@pytest.mark.parametrize(
    "save",
    [_qwen, lambda f: _qwen(f, "qwen2_vl"), _qwen3, _internvl],
    ids=["qwen2_5_vl", "qwen2_vl", "qwen3_vl", "internvl"],
)
def test_a_checkpoint_whose_ids_agree_passes(save, tmp_path):
    _check(save(tmp_path / "ckpt"))


def test_another_image_id_is_refused_naming_both_ids(qwen, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for f in qwen.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    written = json.loads((folder / "config.json").read_text())["image_token_id"]
    _set(folder, image_token_id=5)
    with pytest.raises(ConfigError) as err:
        _check(folder)
    msg = str(err.value)
    assert msg.startswith(f"{folder}/config.json: ")
    assert (
        f"image token id 5 written 0 time(s) where one image of {PROBE_ROWS} rows needs {PROBE_ROWS}" in msg
    )
    assert f"it writes the image as id {written}" in msg


def test_a_wrong_vision_marker_is_refused(qwen, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for f in qwen.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    _set(folder, vision_end_token_id=6)
    with pytest.raises(ConfigError, match="image_end token id 6 written 0 time"):
        _check(folder)


@pytest.fixture(scope="module")
def mismatched(qwen, tmp_path_factory) -> tuple[Path, Path]:
    """(a checkpoint whose config's image id is not its tokenizer's, a LLaVA dataset of 8 records)."""
    root = tmp_path_factory.mktemp("mismatch")
    folder = root / "ckpt"
    folder.mkdir()
    for f in qwen.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    _set(folder, image_token_id=5)
    assert (
        main(["data", "synth", "--dataset", "chartqa", "--num-samples", "8", "--out", str(root / "ds")]) == 0
    )
    return folder, root / "ds" / "data.json"


def test_data_check_with_the_model_refuses_it(mismatched, capsys):
    folder, data = mismatched
    assert main(["data", "check", str(data), "--model-path", str(folder)]) == 2
    assert "image token id 5 written 0 time(s)" in capsys.readouterr().err


def test_train_refuses_it_before_launch(mismatched, monkeypatch, tmp_path, capsys):
    folder, data = mismatched
    launched = []
    monkeypatch.setattr(train_cli, "_launch", lambda *a: launched.append(a) or 0)
    argv = ["train", "--model-path", str(folder), "--dataset", str(data), "--global-batch", "4"]
    assert main([*argv, "--steps", "1", "--nproc", "2", "--out", str(tmp_path / "run")]) == 2
    assert not launched
    assert f"{folder}/config.json: the tokenizer" in capsys.readouterr().err
