"""``--model-path`` end to end for whole Qwen2-VL / Qwen2.5-VL checkpoints: ``plan`` and ``simulate``
price the folder's shapes, a 2-rank ``train`` (forked ranks, no torchrun; encoder and LLM on their
own rank) trains it with M-RoPE positions, and ``export`` writes one folder that transformers'
own class loads, holding the trained weights, whose logits equal the trained staged model's.
``--tp 2 --fsdp`` and resume: tests/runtime/test_fsdp_resume.py (every family); bf16 and
``--freeze``: tests/runtime/test_precision.py."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest
import torch

from entrain.models.families.qwen2_vl import model as qm
from entrain.runtime.checkpoint import checkpoint_dirs, load_model_state
from tests.models.qwen_vl_tiny import FAMILIES, mixed_samples, save_whole
from tests.models.test_qwen2_vl_family import RTOL, hf_logits, per_sample, rel_err, run_staged

COMMON = ["--dataset", "skewed", "--hardware", "cpu-tiny", "--global-batch", "4", "--microbatch-size", "2",
          "--seed", "3"]  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_model_path_plans_trains_on_two_ranks_and_exports(family, tmp_path, capsys):
    from entrain.cli.main import main

    from .cli_ranks import run_ranks

    folder = save_whole(tmp_path / family, family, text_layers=2, vision_depth=2, tied=family == "qwen2_5_vl")
    model = ["--model-path", str(folder)]
    plan = tmp_path / "plan.json"
    assert main(["plan", *model, *COMMON, "--gpus", "2", "--out", str(plan), "--json"]) == 0
    assert main(["simulate", *model, *COMMON, "--gpus", "2", "--systems", "1f1b,entrain", "--iterations", "2",
                 "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    out = tmp_path / "run"
    argv = [
        "train",
        *model,
        "--plan",
        str(plan),
        "--steps",
        "2",
        "--lr",
        "1e-2",
        "--out",
        str(out),
        "--no-progress",
    ]
    results = run_ranks(argv, 2, tmp_path / "ranks", timeout_s=120)
    assert [r.exitcode for r in results] == [0, 0], results[0].stderr[-3000:] + results[1].stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and all(r["loss"] > 0 for r in rows)

    assert main(["export", str(out), "--out", str(tmp_path / "hf"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["model_dir"] == str(tmp_path / "hf")
    jsonschema.validate(
        info, json.loads(resources.files("entrain").joinpath("schemas/export.json").read_text())
    )
    _check_export(folder, tmp_path / "hf", checkpoint_dirs(out)[0][1])


def _check_export(source, exported, checkpoint) -> None:
    """The exported folder holds the run's trained parameters (not the source's) and gives the trained
    staged model's logits."""
    _, trained = load_model_state(checkpoint)
    cls = qm.conditional_generation_class(qm.read_hf_config(str(source)).model_type)
    loaded = cls.from_pretrained(exported, attn_implementation="sdpa").float()
    original = dict(cls.from_pretrained(source).named_parameters())
    for name, p in loaded.named_parameters():
        assert torch.equal(p, trained[name]), name
    assert any(not torch.equal(trained[n], original[n]) for n in original)
    staged = qm.build_model(str(source))
    with torch.no_grad():
        for name, p in staged.named_parameters():
            p.copy_(trained[name])
        samples = mixed_samples()[:2]
        layout = ([(0, 4)], [(0, 5)])  # up to the lm_head: logits at every position
        want = per_sample(run_staged(staged, samples, layout, loss=False), samples)
        for i, s in enumerate(samples):
            assert rel_err(hf_logits(loaded, s), want[i]) < RTOL


def test_the_renderer_packs_the_family_mrope_ids(tmp_path):
    """The runtime's packed LLM batch carries the family's ``[3, T]`` ids (short texts included, whose
    images touch)."""
    from entrain.core.workload.samples import SampleMeta
    from entrain.models.families.base import ModelSource, PackedSample
    from entrain.models.families.registry import get_family
    from entrain.runtime.data import SampleRenderer

    family = get_family("qwen2_vl")
    folder = save_whole(tmp_path / "q", "qwen2_5_vl", text_layers=1, vision_depth=2)
    cfg, _ = family.runtime_config(ModelSource(model_path=str(folder)))
    metas = {
        "a": SampleMeta("a", ((224, 224), (112, 336)), 40),
        "b": SampleMeta("b", (), 12),
        "c": SampleMeta("c", ((224, 224), (224, 224)), 3),
    }
    renderer = SampleRenderer(cfg, metas, seed=0)
    batch = renderer.llm_batch(["a", "b", "c"], 1.0)
    samples = [renderer.sample(i) for i in "abc"]
    want = family.position_ids(
        cfg, [PackedSample(s.input_ids, s.image_positions, s.grid_thw) for s in samples]
    )
    assert batch.position_ids.shape == (3, sum(s.num_tokens for s in samples))
    assert torch.equal(batch.position_ids, want)
    assert not torch.equal(want[1], want[2])  # M-RoPE: the height and width ids of an image differ


def test_profile_times_the_checkpoint_layers(tmp_path, capsys):
    """``entrain profile --model-path`` times the reduced model and writes a profile for every layer."""
    from entrain.cli.main import main

    folder = save_whole(tmp_path / "q", "qwen2_5_vl", text_layers=2, vision_depth=3)
    out = tmp_path / "profile.json"
    argv = ["profile", "--model-path", str(folder), "--device", "cpu", "--tokens", "16,32", "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    profile = json.loads(out.read_text())
    assert profile["model"] == "hf:q"
    text = out.read_text()
    assert "blocks.2" in text and "layers.1" in text
