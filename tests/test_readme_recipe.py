"""The README's "Fine-tune a published model" recipe, run end to end (issue 13, requirement 8).

The commands are read from README.md itself, so the recipe cannot go stale: every command runs on tiny stock checkpoints made here with ``save_pretrained`` (a Qwen2.5-VL vision tower
and a Llama with its own tokenizer) in place of the downloaded folders, at toy sizes: ``plan --out``,
then ``train --plan`` (its two ranks as forked gloo workers, not a torchrun launch), ``plot-trace``
and ``export``, whose folders load back in transformers."""

from __future__ import annotations

import glob
import json
import re
import shlex
from pathlib import Path

import torch
from runtime.harness import run_workers

from entrain.cli.main import build_parser, main
from entrain.cli.train import _spec
from entrain.runtime.session import run_systems
from tests.models.stock import save_llm, save_tokenizer, save_vision

README = Path(__file__).resolve().parents[1] / "README.md"
# the recipe's sizes, scaled to two CPU processes; every other flag runs as written
TOY = {"--gpus": "2", "--global-batch": "4", "--steps": "2"}


def recipe_commands() -> list[list[str]]:
    """The ``entrain`` commands of the recipe's sh block, with ``$M`` expanded (without ``entrain``)."""
    text = README.read_text(encoding="utf-8").split("## Fine-tune a published model", 1)[1]
    block = re.search(r"```sh\n(.*?)```", text, re.S).group(1).replace("\\\n", " ")
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    m_value = next(shlex.split(line[2:])[0] for line in lines if line.startswith("M="))
    return [shlex.split(line.replace("$M", m_value))[1:] for line in lines if line.startswith("entrain ")]


def _substitute(argv: list[str], paths: dict[str, str]) -> list[str]:
    out = []
    for i, arg in enumerate(argv):
        prev = argv[i - 1] if i else ""
        out.append(TOY.get(prev, paths.get(arg.rstrip("/"), arg)))
    return out


def _train(env, spec):
    return [s.last_loss for s in run_systems(spec, env)]


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in glob.glob(f"{folder}/*.safetensors"):
        out.update(load_file(f))
    return out


def test_the_recipe_runs_end_to_end_on_tiny_stock_folders(tmp_path, capsys):
    vision = save_vision(tmp_path / "qwen25vl")
    llm = save_tokenizer(save_llm(tmp_path / "llama", vocab=290))
    assert (
        main(["data", "synth", "--dataset", "chartqa", "--num-samples", "8", "--out", str(tmp_path / "ds")])
        == 0
    )
    paths = {
        "ckpt/qwen25vl-3b": str(vision),
        "ckpt/llama32-1b": str(llm),
        "ds/data.json": str(tmp_path / "ds" / "data.json"),
        "plan.json": str(tmp_path / "plan.json"),
        "run": str(tmp_path / "run"),
        "run/gantt.png": str(tmp_path / "run" / "gantt.png"),
        "hf": str(tmp_path / "hf"),
    }
    commands = recipe_commands()
    assert [c[0] for c in commands] == ["plan", "train", "plot-trace", "export"]
    plan, train, plot, export = (_substitute(c, paths) for c in commands)

    assert main(plan) == 0
    planned = json.loads((tmp_path / "plan.json").read_text())
    assert planned["model"] == "hf:qwen25vl+llama" and planned["global_batch"] == 4

    spec = _spec(build_parser().parse_args([*train, "--no-progress"]))
    losses = run_workers(_train, 2, tmp_path / "workers", spec, timeout_s=120)
    assert losses[0] == losses[1]
    ran = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert ran["layout"] == planned["layout"] and ran["system"] == planned["system"]
    assert (tmp_path / "run" / "trace.json").is_file() and list((tmp_path / "run" / "tensorboard").iterdir())

    assert main(plot) == 0 and (tmp_path / "run" / "gantt.png").stat().st_size > 0
    assert main(export) == 0
    capsys.readouterr()
    _check_export(vision, tmp_path / "hf")


def _check_export(vision: Path, hf: Path) -> None:
    """``--freeze vit``: the tower's blocks come back bitwise, the trained merger does not; both
    folders load in transformers, the LLM with its tokenizer (now holding the image tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    before, after = _tensors(vision), _tensors(hf / "vision")
    assert set(before) == set(after)
    assert all(torch.equal(before[k], after[k]) for k in before if not k.startswith("merger."))
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("merger."))
    Qwen2_5_VisionTransformerPretrainedModel.from_pretrained(hf / "vision")
    model = AutoModelForCausalLM.from_pretrained(hf / "llm")
    tokenizer = AutoTokenizer.from_pretrained(hf / "llm")
    assert "<|image_pad|>" in tokenizer.get_vocab()
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
