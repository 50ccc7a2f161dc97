"""Fixtures of the journeys: ``train`` on forked ranks, the tiny stock checkpoints, a tiny dataset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.journeys.forked_launch import forked_workers
from tests.journeys.scale import MODELS_ENV, STOCK_FOLDERS, scale


@pytest.fixture(autouse=True)
def _forked_train(monkeypatch):
    forked_workers(monkeypatch)


def _save(kind: str, folder: Path) -> Path:
    if kind == "llama":
        from tests.models.stock import save_llm, save_tokenizer

        return save_tokenizer(save_llm(folder, vocab=290))
    if kind == "qwen3_vl":
        from tests.models.qwen3_vl_tiny import save_whole

        return save_whole(folder, text_layers=3, vision_depth=4)
    from tests.models.qwen_vl_tiny import save_with_tokenizer

    return save_with_tokenizer(folder, kind, text_layers=2, vision_depth=2, tied=True)


@pytest.fixture(scope="session")
def stock_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Each kind of ``STOCK_FOLDERS`` saved once, tiny: ``{kind: folder}`` (the family journeys use
    them at every scale)."""
    root = tmp_path_factory.mktemp("stock")
    return {kind: _save(kind, root / kind) for kind in sorted(set(STOCK_FOLDERS.values()))}


@pytest.fixture
def place_stock(stock_checkpoints):
    """``place_stock(folder)``: the documented model folders under ``folder``, as links to the tiny
    checkpoints (``tiny``) or to ``$ENTRAIN_JOURNEY_MODELS/<path>`` (``full``)."""

    def place(folder: Path) -> None:
        for path, kind in STOCK_FOLDERS.items():
            if scale() == "full":
                target = Path(os.environ.get(MODELS_ENV, ".")).resolve() / path
            else:
                target = stock_checkpoints[kind]
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).symlink_to(target, target_is_directory=True)

    return place


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    """``data synth --dataset chartqa --num-samples 8``: a LLaVA dataset of 8 chart records."""
    from entrain.cli.main import main

    out = tmp_path_factory.mktemp("data") / "ds"
    assert main(["data", "synth", "--dataset", "chartqa", "--num-samples", "8", "--out", str(out)]) == 0
    return out / "data.json"
