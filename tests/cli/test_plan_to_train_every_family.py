"""Every model family goes from ``entrain plan --out FILE`` to ``entrain train --plan FILE``: the plan
is accepted by the train front-end and the argv it hands its torchrun workers is accepted by the
workers' own flag parser and gives them the same run (no torchrun is started: ``_launch`` is stubbed).
A family's "no pixel limit" placeholder (LLaVA-OneVision's AnyRes) once went into the workers' argv
as ``--max-pixels 4611686018427387904`` and every worker refused it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrain.cli import train as train_cli
from entrain.cli.main import main
from entrain.cli.train_args import child_argv
from entrain.models.families.registry import families
from entrain.runtime.model_source import model_family


def _llava_checkpoint(folder: Path) -> list[str]:
    import torch
    from transformers import LlavaOnevisionForConditionalGeneration

    from tests.models.test_llava_onevision import _config

    torch.manual_seed(0)
    LlavaOnevisionForConditionalGeneration(_config()).save_pretrained(folder)
    return ["--model-path", str(folder)]


def _qwen_checkpoint(family: str):
    def save(folder: Path) -> list[str]:
        from tests.models.qwen_vl_tiny import save_with_tokenizer

        save_with_tokenizer(folder, family, text_layers=2, vision_depth=2, tied=True)
        return ["--model-path", str(folder)]

    return save


def _internvl_checkpoint(folder: Path) -> list[str]:
    tiny = pytest.importorskip("tests.models.internvl_tiny")
    return ["--model-path", str(tiny.save_internvl(folder))]


def _qwen3_vl_checkpoint(folder: Path) -> list[str]:
    from tests.models.qwen3_vl_tiny import save_whole

    return ["--model-path", str(save_whole(folder, text_layers=3, vision_depth=4))]


def _qwen2_5_omni_checkpoint(folder: Path) -> list[str]:
    from tests.models.qwen2_5_omni_tiny import save_whole

    return ["--model-path", str(save_whole(folder, text_layers=2, vision_depth=2, audio_layers=1))]


def _qwen3_vl_moe_checkpoint(folder: Path) -> list[str]:
    from tests.models.qwen3_vl_moe_tiny import save_whole

    return ["--model-path", str(save_whole(folder, text_layers=2))]


MODELS = {  # case: (the registry family that runs it, its model flags given a folder to save into)
    "composition-preset": ("composition", lambda folder: ["--model", "tiny"]),
    "qwen2_vl-checkpoint": ("qwen2_vl", _qwen_checkpoint("qwen2_vl")),
    "qwen2_5_vl-checkpoint": ("qwen2_vl", _qwen_checkpoint("qwen2_5_vl")),
    "llava_onevision-preset": ("llava_onevision", lambda folder: ["--model", "llava-ov-tiny"]),
    "llava_onevision-checkpoint": ("llava_onevision", _llava_checkpoint),
    "internvl-checkpoint": ("internvl", _internvl_checkpoint),
    "qwen3_vl-checkpoint": ("qwen3_vl", _qwen3_vl_checkpoint),
    "qwen2_5_omni-checkpoint": ("qwen2_5_omni", _qwen2_5_omni_checkpoint),
    "qwen3_vl_moe-checkpoint": ("qwen3_vl_moe", _qwen3_vl_moe_checkpoint),
}


def test_every_registered_family_has_a_case():
    assert {f.name for f in families()} <= {family for family, _ in MODELS.values()}


@pytest.fixture
def launched(monkeypatch) -> list:
    """``(args, spec)`` of each ``train`` that would have started torchrun (none is started)."""
    calls = []
    monkeypatch.setattr(train_cli, "_launch", lambda args, spec, nproc: calls.append((args, spec)) or 0)
    return calls


@pytest.mark.parametrize("case", MODELS)
def test_a_plan_of_every_family_trains(tmp_path, capsys, launched, case):
    family, model_flags = MODELS[case]
    flags = model_flags(tmp_path / "ckpt")
    plan = tmp_path / "plan.json"
    argv = ["plan", *flags, "--dataset", "skewed", "--gpus", "2", "--global-batch", "4",
            "--microbatch-size", "1", "--out", str(plan)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    out = str(tmp_path / "run")
    assert main(["train", "--plan", str(plan), "--out", out]) == 0, capsys.readouterr().err
    (args, spec) = launched.pop()
    assert model_family(spec).name == family
    worker = child_argv(args)  # what each torchrun worker parses
    assert main(["train", *worker]) == 0, f"{worker}: {capsys.readouterr().err}"
    (_, again) = launched.pop()
    assert again.to_json() == spec.to_json()
    written = json.loads(plan.read_text())
    vision = spec.data.vision(spec.model)
    assert (vision.min_pixels, vision.max_pixels) == (written["min_pixels"], written["max_pixels"])
