"""The README's "Fine-tune Qwen2.5-VL as it is" recipe, run end to end (issue 20, requirement 5).

The commands are read from README.md itself: ``plan --out`` -> ``train --plan`` (two ranks as forked
gloo workers, not a torchrun launch) -> ``export`` -> the python line loading the export in
transformers, on a tiny Qwen2.5-VL checkpoint made here with ``save_pretrained`` (with its own
tokenizer and image processor config) in place of the downloaded folder, at toy sizes."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import torch
from runtime.harness import run_workers

from entrain.cli.main import build_parser, main
from entrain.cli.train import _spec
from tests.models.qwen_vl_tiny import save_with_tokenizer
from tests.test_readme_recipe import _substitute, _train  # the same toy sizes and rank runner

README = Path(__file__).resolve().parents[1] / "README.md"


def recipe_lines() -> list[str]:
    text = README.read_text(encoding="utf-8").split("## Fine-tune Qwen2.5-VL as it is", 1)[1]
    block = re.search(r"```sh\n(.*?)```", text, re.S).group(1).replace("\\\n", " ")
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if not line.startswith("#")]


def recipe_commands() -> tuple[list[list[str]], str]:
    """The ``entrain`` commands (``$M`` expanded, without ``entrain``) and the python line."""
    lines = recipe_lines()
    m_value = next(shlex.split(line[2:])[0] for line in lines if line.startswith("M="))
    commands = [shlex.split(line.replace("$M", m_value))[1:] for line in lines if line.startswith("entrain ")]
    python = next(line for line in lines if line.startswith("python "))
    return commands, shlex.split(python)[2]


def test_the_qwen_recipe_runs_end_to_end(tmp_path, capsys):
    ckpt = save_with_tokenizer(tmp_path / "qwen25vl", "qwen2_5_vl", text_layers=2, vision_depth=2, tied=True)
    assert (
        main(["data", "synth", "--dataset", "chartqa", "--num-samples", "8", "--out", str(tmp_path / "ds")])
        == 0
    )
    paths = {
        "ckpt/qwen25vl-3b": str(ckpt),
        "ds/data.json": str(tmp_path / "ds" / "data.json"),
        "plan.json": str(tmp_path / "plan.json"),
        "run": str(tmp_path / "run"),
        "hf": str(tmp_path / "hf"),
    }
    commands, python = recipe_commands()
    assert [c[0] for c in commands] == ["plan", "train", "export"]
    plan, train, export = (_substitute(c, paths) for c in commands)
    assert main(plan) == 0
    assert json.loads((tmp_path / "plan.json").read_text())["global_batch"] == 4

    spec = _spec(build_parser().parse_args([*train, "--no-progress"]))
    losses = run_workers(_train, 2, tmp_path / "workers", spec, timeout_s=120)
    assert losses[0] == losses[1] and all(x > 0 for x in losses[0])
    assert main(export) == 0
    capsys.readouterr()
    _check_export(ckpt, tmp_path / "hf", python)


def _check_export(ckpt: Path, hf: Path, python: str) -> None:
    """The README's python line loads the export; its tokenizer and processor files are the source's;
    the weights moved from the source's."""
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    done = subprocess.run([sys.executable, "-c", python.replace("'hf/'", repr(str(hf)))], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    for name in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        assert (hf / name).read_bytes() == (ckpt / name).read_bytes(), name
    tok = AutoTokenizer.from_pretrained(hf)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(hf)
    assert tok.convert_tokens_to_ids("<|image_pad|>") == model.config.image_token_id
    source = dict(Qwen2_5_VLForConditionalGeneration.from_pretrained(ckpt).named_parameters())
    assert any(not torch.equal(p, source[n]) for n, p in model.named_parameters())
