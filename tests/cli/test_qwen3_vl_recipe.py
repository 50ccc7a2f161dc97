"""The README's Qwen3-VL recipe, command for command, on a tiny random checkpoint: ``entrain plan
--model-path`` on a LLaVA dataset with images, ``entrain train --plan`` on 2 ranks (forked, as torchrun
starts them) at ``--lr 0``, ``entrain export``; transformers' ``Qwen3VLForConditionalGeneration`` loads
the exported folder with no missing or unexpected tensor and every tensor equal to the input's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from entrain.cli.main import main
from tests.models.qwen3_vl_tiny import save_with_tokenizer
from tests.runtime.cli_ranks import run_ranks


def _dataset(folder: Path) -> Path:
    """Four LLaVA records with one image each (two sizes) and one text-only record."""
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(0)
    records = []
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (64 + 32 * (i % 2), 96, 3), dtype=np.uint8)).save(
            folder / f"{i}.png"
        )
        records.append({"id": f"r{i}", "image": f"{i}.png", "conversations": [
            {"from": "human", "value": "<image>\nWhat is in the picture?"},
            {"from": "gpt", "value": f"Noise, picture {i}."}]})  # fmt: skip
    records.append({"id": "t", "conversations": [{"from": "human", "value": "Hello?"},
                                                 {"from": "gpt", "value": "Hi."}]})  # fmt: skip
    (folder / "data.json").write_text(json.dumps(records))
    return folder / "data.json"


def test_plan_train_export_at_lr_0_gives_back_the_input_checkpoint(tmp_path, capsys):
    from transformers import Qwen3VLForConditionalGeneration

    ckpt = save_with_tokenizer(tmp_path / "ckpt", text_layers=2, vision_depth=2, taps=(0, 1), shard=None)
    data = _dataset(tmp_path / "ds")
    model = ["--model-path", str(ckpt), "--max-pixels", "1003520"]
    plan, run, hf = tmp_path / "plan.json", tmp_path / "run", tmp_path / "hf"
    argv = ["plan", *model, "--dataset", str(data), "--gpus", "2", "--global-batch", "4",
            "--microbatch-size", "1", "--out", str(plan)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    argv = ["train", *model, "--plan", str(plan), "--dataset", str(data), "--steps", "1", "--lr", "0",
            "--no-progress", "--out", str(run)]  # fmt: skip
    ranks = run_ranks(argv, 2, tmp_path / "ranks", env={"ENTRAIN_PLAN_PREFETCH": "0"}, timeout_s=60)
    assert [r.exitcode for r in ranks] == [0, 0], ranks[0].stderr[-3000:] + ranks[1].stderr[-3000:]
    loss = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    assert np.isfinite(loss) and loss > 0
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(hf), "--json"]) == 0
    assert Path(json.loads(capsys.readouterr().out)["model_dir"]) == hf
    assert (hf / "preprocessor_config.json").is_file() and (hf / "tokenizer_config.json").is_file()
    source = Qwen3VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).state_dict()
    got, loading = Qwen3VLForConditionalGeneration.from_pretrained(
        hf, dtype=torch.float32, output_loading_info=True
    )
    assert not any(loading[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), loading
    exported = got.state_dict()
    assert exported.keys() == source.keys()
    for name, t in exported.items():
        assert torch.equal(t, source[name]), name


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
