"""LLaVA-OneVision through the runtime: ``entrain train`` on 2 forked gloo ranks (``--model
llava-ov-tiny`` and ``--model-path`` of a tiny saved checkpoint), single- and multi-image samples,
reports the step-0 loss of transformers' ``LlavaOnevisionForConditionalGeneration`` run one sample
at a time on the same rendered samples (the encoder stage unpads by the original image size it gets
through the seam's ``image_extras``)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
import torch.nn.functional as F

from entrain.core.workload.samples import SampleMeta
from entrain.models.families.base import ModelSource
from entrain.models.families.llava_onevision.family import ONEVISION_FAMILY as FAM
from entrain.models.families.llava_onevision.model import rows_to_tiles
from entrain.models.families.llava_onevision.processing import image_processor
from entrain.runtime.data import SampleRenderer

from .cli_ranks import run_ranks

PRESET = "llava-ov-tiny"
SCHEMAS = Path(__file__).resolve().parents[2] / "entrain" / "schemas"
SEED = 0


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """The preset's seeded model saved as a Hugging Face folder (what ``--model-path`` reads)."""
    cfg, _ = FAM.runtime_config(ModelSource(preset=PRESET))
    path = tmp_path_factory.mktemp("ov") / "tiny"
    FAM.build_model(cfg, seed=SEED).hf.save_pretrained(path)
    image_processor(cfg).save_pretrained(path)
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


def _entrain_logits(params: dict, run_cfg, renderer, sid: str) -> torch.Tensor:
    """The trained model through Entrain's own stages (one encoder stage, one LLM stage up to lm_head):
    logits at the sample's label positions."""
    from entrain.models.families.llava_onevision import model as ov

    model = FAM.build_model(run_cfg, seed=SEED)
    model.hf.load_state_dict(params, strict=False)
    enc = FAM.build_stage(model, "encoder", 0, len(model.layer_names("encoder")))
    feats = enc(renderer.patches(sid), renderer.encoder_input([sid]).grid_thw)
    llm = ov.build_stage(model, "llm", 0, len(model.layer_names("llm")) - 1)
    return llm(feats, renderer.llm_batch([sid], 1.0))


@pytest.mark.parametrize("source", ["preset", "path"])
def test_export_is_one_folder_transformers_loads_with_the_trained_logits(
    source, tiny_folder, tmp_path, capsys
):
    from transformers import LlavaOnevisionForConditionalGeneration

    from entrain.cli.export import _choose
    from entrain.cli.main import main

    run, exported = tmp_path / "run", tmp_path / "export"
    model = ["--model", PRESET] if source == "preset" else ["--model-path", tiny_folder]
    argv = ["train", *model, "--dataset", "skewed", "--hardware", "cpu-tiny", "--global-batch", "2",
            "--microbatch-size", "1", "--steps", "1", "--out", str(run), "--no-progress", "--lr", "0.05"]  # fmt: skip
    results = run_ranks(argv, 2, tmp_path / "ranks", timeout_s=120, wrap=_with_model_path_flag)
    assert [r.exitcode for r in results] == [0, 0], results[0].stderr[-3000:] + results[1].stderr[-3000:]
    assert main(["export", str(run), "--out", str(exported), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    jsonschema.validate(info, json.loads((SCHEMAS / "export.json").read_text()))
    assert (exported / "preprocessor_config.json").is_file()
    _, params = _choose(str(run), None)
    src = ModelSource(preset=PRESET) if source == "preset" else ModelSource(model_path=tiny_folder)
    run_cfg = _run_cfg(src)
    initial = dict(FAM.build_model(run_cfg, seed=SEED).hf.named_parameters())
    assert not torch.equal(params["lm_head.weight"], initial["lm_head.weight"].detach()), "the run must train"
    metas, ids = _step0(run / "plan.json")
    sid = next(i for i in ids if metas[i].images)
    renderer = SampleRenderer(run_cfg, dict(metas), seed=SEED)
    want = _entrain_logits(params, run_cfg, renderer, sid)
    hf = LlavaOnevisionForConditionalGeneration.from_pretrained(exported, dtype=torch.float32)
    s = renderer.sample(sid)
    kw = _pixels(renderer, sid, [g[0] for g in s.grid_thw], [list(e) for e in s.extras])
    with torch.no_grad():
        got = hf(input_ids=s.input_ids[None], **kw).logits[0, s.label_positions]
    err = float((got - want.detach()).abs().max())
    assert err <= 1e-5 * float(want.detach().abs().max()), err


def _losses(tmp_path, name: str, argv: list[str], world: int = 2) -> list[float]:
    """Per step: the loss and the gradient norm."""
    out = tmp_path / name
    full = [*argv, "--steps", "2", "--out", str(out), "--no-progress", "--lr", "0.05"]
    results = run_ranks(full, world, tmp_path / f"ranks-{name}", timeout_s=120)
    assert [r.exitcode for r in results] == [0] * world, "".join(r.stderr[-2000:] for r in results)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [v for r in rows for v in (r["loss"], r["grad_norm"])]


def _plan_with_recompute(plan_path, mode: str):
    plan = json.loads(plan_path.read_text())
    for stage in plan["layout"]["stages"]:
        stage["recompute"] = mode
    path = plan_path.with_name(f"plan-{mode}.json")
    path.write_text(json.dumps(plan))
    return path


def test_fsdp_and_recompute_train_to_the_same_losses(tmp_path):
    """Two steps (the second loss shows the first update; losses and gradient norms): pipeline 1+1
    plain, with full and selective recomputation of every stage (2 gloo ranks), and FSDP over 2
    data-parallel replicas of 1+1 (4)."""
    from entrain.cli.main import main

    common = ["--model", PRESET, "--dataset", "multi-image", "--hardware", "cpu-tiny", "--global-batch", "4",
              "--microbatch-size", "1", "--seed", str(SEED)]  # fmt: skip
    plan = tmp_path / "plan.json"
    assert main(["plan", *common, "--gpus", "2", "--system", "1f1b", "--out", str(plan)]) == 0
    base = _losses(tmp_path, "base", ["train", "--plan", str(plan)])
    runs = {m: ["train", "--plan", str(_plan_with_recompute(plan, m))] for m in ("full", "selective")}
    runs["fsdp"] = ["train", *common, "--fsdp", "--dp", "2", "--encoder-stages", "1", "--llm-stages", "1"]
    for name, argv in runs.items():
        got = _losses(tmp_path, name, argv, 4 if name == "fsdp" else 2)
        assert len(got) == 4 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, base)), (
            name,
            got,
            base,
        )


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recompute_reruns_each_wrapped_layer_in_the_backward(mode):
    """Every module the family names for ``mode`` is on the stage's forward path and runs twice in a
    step (forward, then again in the backward) once the runtime wraps it."""
    from entrain.models.families.registry import build_stage
    from entrain.runtime.recompute import apply_recompute

    cfg = _run_cfg(ModelSource(preset=PRESET))
    rule = FAM.image_rule(cfg.shape, None, None)
    metas = {"a": SampleMeta("a", ((60, 90),), 12, vision=rule)}
    renderer = SampleRenderer(cfg, metas, seed=SEED)
    model = FAM.build_model(cfg, seed=SEED)
    stages = [build_stage(model, c, 0, len(model.layer_names(c))) for c in ("encoder", "llm")]
    calls: dict[int, int] = {}
    for stage in stages:
        mods = FAM.recompute_modules(stage, mode)
        assert len(mods) == 2, mode  # the tiny model's two SigLIP / two Qwen2 layers
        for m in mods:
            calls[id(m)] = 0
            m.forward = _counting(m.forward, calls, id(m))
        assert apply_recompute(stage, mode) == 2
    feats = stages[0](renderer.patches("a"), renderer.encoder_input(["a"]).grid_thw)
    stages[1](feats, renderer.llm_batch(["a"], 1.0)).backward()
    assert sorted(calls.values()) == [2] * 4, calls


def _counting(forward, calls: dict, key: int):
    def run(*args, **kwargs):
        calls[key] += 1
        return forward(*args, **kwargs)

    return run
