"""Every registered model family, each ``model_type`` it claims, from a tiny checkpoint folder through
``plan --out`` -> ``train --plan`` (1 step, a checkpoint) -> ``train --resume`` (step 2) -> ``export``
-> ``from_pretrained`` of the export (no missing, unexpected or mismatched tensor). ``train`` runs its
real front process on 2 forked ranks (tests/journeys/forked_launch.py). A family of the registry
without a checkpoint in ``CHECKPOINTS`` fails the first test."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from entrain.models.families.registry import families
from tests.journeys.loading import check_export
from tests.journeys.outcomes import check_run_records


def _llava(folder: Path, stock: dict) -> list[str]:
    """The ``llava-ov-tiny`` preset's model saved as a Hugging Face folder, with its image processor."""
    from entrain.models.families.base import ModelSource
    from entrain.models.families.llava_onevision.family import ONEVISION_FAMILY
    from entrain.models.families.llava_onevision.processing import image_processor

    cfg, _ = ONEVISION_FAMILY.runtime_config(ModelSource(preset="llava-ov-tiny"))
    ONEVISION_FAMILY.build_model(cfg, seed=0).hf.save_pretrained(folder)
    image_processor(cfg).save_pretrained(folder)
    return ["--model-path", str(folder)]


def _qwen(model_type: str) -> Callable[[Path, dict], list[str]]:
    def save(folder: Path, stock: dict) -> list[str]:
        if model_type in stock:  # the README journeys' checkpoint, saved once
            return ["--model-path", str(stock[model_type])]
        from tests.models.qwen_vl_tiny import save_with_tokenizer

        return [
            "--model-path",
            str(save_with_tokenizer(folder, model_type, text_layers=2, vision_depth=2, tied=True)),
        ]

    return save


def _internvl(folder: Path, stock: dict) -> list[str]:
    from tests.models.internvl_tiny import save_internvl

    return ["--model-path", str(save_internvl(folder))]


def _qwen3_vl(folder: Path, stock: dict) -> list[str]:
    from tests.models.qwen3_vl_tiny import save_whole

    return ["--model-path", str(save_whole(folder, text_layers=3, vision_depth=4))]


def _qwen2_5_omni(whole: bool) -> Callable[[Path, dict], list[str]]:
    def save(folder: Path, stock: dict) -> list[str]:
        from tests.models.qwen2_5_omni_tiny import save_whole, save_whole_omni

        saved = (save_whole_omni if whole else save_whole)(
            folder, text_layers=2, vision_depth=2, audio_layers=1
        )
        return ["--model-path", str(saved)]

    return save


def _qwen3_vl_moe(folder: Path, stock: dict) -> list[str]:
    from tests.models.qwen3_vl_moe_tiny import save_whole

    return ["--model-path", str(save_whole(folder, text_layers=2))]


CHECKPOINTS: dict[tuple[str, str], Callable[[Path, dict], list[str]]] = {
    ("composition", "stock folders"): lambda folder, stock: [
        *("--vision-model", str(stock["qwen2_5_vl"]), "--llm-model", str(stock["llama"]))
    ],
    ("internvl", "internvl"): _internvl,
    ("llava_onevision", "llava_onevision"): _llava,
    ("qwen2_vl", "qwen2_vl"): _qwen("qwen2_vl"),
    ("qwen2_vl", "qwen2_5_vl"): _qwen("qwen2_5_vl"),
    ("qwen3_vl", "qwen3_vl"): _qwen3_vl,
    ("qwen3_vl_moe", "qwen3_vl_moe"): _qwen3_vl_moe,
    ("qwen2_5_omni", "qwen2_5_omni_thinker"): _qwen2_5_omni(whole=False),
    ("qwen2_5_omni", "qwen2_5_omni"): _qwen2_5_omni(whole=True),
}
"""(registry family, ``model_type`` of its checkpoint; the composition's is a stock vision folder
and a stock LLM folder) -> the model flags of a tiny checkpoint saved under a folder."""


def registered() -> list[tuple[str, str]]:
    return [(f.name, t) for f in families() for t in (f.model_types() or ("stock folders",))]


def test_every_registered_family_has_a_journey():
    missing = [case for case in registered() if case not in CHECKPOINTS]
    assert not missing, f"families without a journey (add a tiny checkpoint to CHECKPOINTS): {missing}"


def _entrain(capsys, *argv: str) -> None:
    from entrain.cli.main import main

    rc = main(list(argv))
    assert rc == 0, f"entrain {' '.join(argv)}: exit {rc}: {capsys.readouterr().err[-3000:]}"
    capsys.readouterr()


@pytest.mark.parametrize("case", registered(), ids=["-".join(c) for c in registered()])
def test_a_family_plans_trains_resumes_and_exports(
    case, tmp_path, monkeypatch, capsys, stock_checkpoints, tiny_dataset
):
    assert case in CHECKPOINTS, f"{case}: no tiny checkpoint in CHECKPOINTS"
    model = CHECKPOINTS[case](tmp_path / "ckpt", stock_checkpoints)
    monkeypatch.chdir(tmp_path)
    _entrain(capsys, "plan", *model, "--dataset", str(tiny_dataset), "--gpus", "2", "--global-batch", "4",
             "--microbatch-size", "1", "--out", "plan.json")  # fmt: skip
    first = ["train", "--plan", "plan.json", "--steps", "1", "--checkpoint-every", "1", "--out", "run"]
    _entrain(capsys, *first)
    check_run_records(["entrain", *first], tmp_path, tmp_path / "run")
    again = [
        "train",
        "--plan",
        "plan.json",
        "--steps",
        "2",
        "--checkpoint-every",
        "1",
        "--resume",
        "--out",
        "run",
    ]
    _entrain(capsys, *again)
    check_run_records(["entrain", *again], tmp_path, tmp_path / "run")
    assert json.loads((tmp_path / "run" / "config.json").read_text())["resumed_from_step"] == 1
    _entrain(capsys, "export", "run", "--out", "hf")
    check_export(tmp_path / "run", tmp_path / "hf")
