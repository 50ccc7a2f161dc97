"""Fixtures of the journeys: ``train`` on forked ranks, the tiny stock checkpoints, a tiny dataset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.journeys.forked_launch import forked_workers
from tests.journeys.scale import MODELS_ENV, STOCK_FOLDERS, scale
from tests.shared_runs import session_folder, share_bench_paper


@pytest.fixture(autouse=True)
def _forked_train(monkeypatch):
    forked_workers(monkeypatch)


@pytest.fixture(autouse=True)
def _shared_bench_numbers(monkeypatch, tmp_path_factory):
    """``bench paper``'s numbers computed once a session for every test that runs it with the same flags
    (tests/shared_runs.py: tests/cli/test_bench_cli.py runs ``--quick`` too); the command's flags, report
    and files are this journey's own."""
    share_bench_paper(monkeypatch, session_folder(tmp_path_factory))


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
