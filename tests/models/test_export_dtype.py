"""``cast_export``: a sharded export (two safetensors files and their index) and nested configs: every
floating tensor rounded to the dtype, integer tensors untouched, the index's ``total_size`` the new
files' tensor bytes, every ``dtype`` key of ``config.json`` (sub-configs too) renamed."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from entrain.models.families.export_dtype import cast_export


def _sharded(folder):
    shards = {
        "model-00001-of-00002.safetensors": {"a.weight": torch.randn(4, 3), "ids": torch.arange(5)},
        "model-00002-of-00002.safetensors": {"b.weight": torch.randn(2, 2, dtype=torch.float64)},
    }
    for name, tensors in shards.items():
        save_file(tensors, folder / name)
    index = {
        "metadata": {"total_size": 12 * 4 + 4 * 8},
        "weight_map": {k: n for n, t in shards.items() for k in t},
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {"dtype": "float32", "text_config": {"dtype": "float32"}, "vision_config": {"hidden_size": 8}}
    (folder / "config.json").write_text(json.dumps(config))
    return shards


def test_a_sharded_export_is_cast_with_its_index_and_configs(tmp_path):
    shards = _sharded(tmp_path)
    cast_export(tmp_path, "bfloat16")
    for name, tensors in shards.items():
        got = load_file(tmp_path / name)
        for key, t in tensors.items():
            want = t.to(torch.bfloat16) if t.is_floating_point() else t
            assert got[key].dtype == want.dtype and torch.equal(got[key], want), key
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 12 * 2 + 5 * 8 + 4 * 2
    assert set(index["weight_map"]) == {"a.weight", "ids", "b.weight"}
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["dtype"] == config["text_config"]["dtype"] == "bfloat16"
    assert "dtype" not in config["vision_config"]


def test_float32_leaves_the_files_as_written_and_an_unknown_dtype_is_refused(tmp_path):
    _sharded(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    cast_export(tmp_path, "float32")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    with pytest.raises(ValueError, match="int8"):
        cast_export(tmp_path, "int8")
