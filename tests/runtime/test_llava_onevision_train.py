"""LLaVA-OneVision through the runtime: ``entrain train`` on 2 forked gloo ranks (``--model
llava-ov-tiny`` and ``--model-path`` of a tiny saved checkpoint), single- and multi-image samples,
reports the step-0 loss of transformers' ``LlavaOnevisionForConditionalGeneration`` run one sample
at a time on the same rendered samples (the encoder stage unpads by the original image size it gets
through the seam's ``image_extras``)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from entrain.core.samples import SampleMeta
from entrain.models.families.base import ModelSource
from entrain.models.families.llava_onevision.family import ONEVISION_FAMILY as FAM
from entrain.models.families.llava_onevision.model import rows_to_tiles
from entrain.runtime.data import SampleRenderer

from .cli_ranks import run_ranks

PRESET = "llava-ov-tiny"
SEED = 0


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """The preset's seeded model saved as a Hugging Face folder (what ``--model-path`` reads)."""
    cfg, _ = FAM.runtime_config(ModelSource(preset=PRESET))
    path = tmp_path_factory.mktemp("ov") / "tiny"
    FAM.build_model(cfg, seed=SEED).hf.save_pretrained(path)
    return str(path)


def _run_cfg(source: ModelSource):
    return FAM.runtime_config(source)[0]


def _pixels(renderer, sid: str, tiles: list[int], sizes) -> dict:
    """transformers' image inputs of one rendered sample: ``[images, max tiles, 3, S, S]``."""
    cfg = renderer.cfg.shape.vision
    all_tiles = rows_to_tiles(renderer.patches(sid), sum(tiles), 3, cfg.patch_size)
    per = all_tiles.split(tiles)
    pad = max(tiles)
    values = torch.stack([torch.cat([p, p.new_zeros((pad - len(p), *p.shape[1:]))]) for p in per])
    return {
        "pixel_values": values,
        "image_sizes": torch.tensor(sizes),
        "batch_num_images": torch.tensor([len(sizes)]),
    }


def _hf_loss(folder: str, run_cfg, metas: dict[str, SampleMeta], ids: list[str]) -> float:
    """sum(token CE) / labels of the batch, transformers' model on each sample alone."""
    from transformers import LlavaOnevisionForConditionalGeneration

    hf = LlavaOnevisionForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    renderer = SampleRenderer(run_cfg, dict(metas), seed=SEED)
    total = 0.0
    with torch.no_grad():
        for sid in ids:
            s = renderer.sample(sid)
            kw = {}
            if s.grid_thw:
                kw = _pixels(renderer, sid, [g[0] for g in s.grid_thw], [list(e) for e in s.extras])
            logits = hf(input_ids=s.input_ids[None], **kw).logits[0, s.label_positions]
            total += float(F.cross_entropy(logits, s.targets, reduction="sum"))
    return total / renderer.num_labels(ids)


def _step0(plan_path) -> tuple[dict[str, SampleMeta], list[str]]:
    plan = json.loads(plan_path.read_text())
    rule = FAM.image_rule(FAM.shape(ModelSource(preset=PRESET)), None, None)
    metas = {s["id"]: SampleMeta.from_json(s["meta"], rule) for s in plan["samples"]}
    replicas = plan["iterations"][0]["assignment"]["replicas"]
    ids = [i for r in replicas for mb in r["llm_microbatches"] for i in mb]
    return metas, ids


def _with_model_path_flag(run):
    """Until the CLI has ``--model-path`` (the seam's ``ModelSource.model_path``; ``RunConfig`` reads
    it from the flags), each rank's ``train`` parser gets the flag here."""
    import entrain.cli.train as train

    add = train.add_model_source_args

    def with_flag(p):
        add(p)
        if "--model-path" not in p._option_string_actions:
            p.add_argument("--model-path", default=None)

    train.add_model_source_args = with_flag
    return run()


@pytest.mark.parametrize(
    "source,dataset", [("preset", "skewed"), ("path", "multi-image")], ids=["preset-single", "path-multi"]
)
def test_two_rank_training_loss_equals_transformers(source, dataset, tiny_folder, tmp_path, capsys):
    from entrain.cli.main import main

    common = ["--dataset", dataset, "--hardware", "cpu-tiny", "--global-batch", "4", "--microbatch-size", "1",
              "--seed", str(SEED)]  # fmt: skip
    out = tmp_path / "run"
    run = ["--steps", "1", "--out", str(out), "--no-progress"]
    if source == "preset":
        plan = tmp_path / "plan.json"
        assert (
            main(["plan", "--model", PRESET, *common, "--gpus", "2", "--system", "1f1b", "--out", str(plan)])
            == 0
        )
        argv, wrap = ["train", "--plan", str(plan), *run], None
    else:
        argv, wrap = ["train", "--model-path", tiny_folder, *common, *run], _with_model_path_flag
    capsys.readouterr()
    results = run_ranks(argv, 2, tmp_path / "ranks", timeout_s=120, wrap=wrap)
    assert [r.exitcode for r in results] == [0, 0], results[0].stderr[-3000:] + results[1].stderr[-3000:]
    metas, ids = _step0(out / "plan.json")
    if dataset == "multi-image":
        assert any(len(metas[i].images) > 1 for i in ids), "the batch must hold a multi-image sample"
    loss = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    run_cfg = _run_cfg(
        ModelSource(preset=PRESET) if source == "preset" else ModelSource(model_path=tiny_folder)
    )
    want = _hf_loss(tiny_folder, run_cfg, metas, ids)
    assert abs(loss - want) <= 1e-5 * abs(want), (loss, want)
