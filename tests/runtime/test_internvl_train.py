"""InternVL through the runtime, against transformers' own ``InternVLForConditionalGeneration``.

* Exact gradients: pipeline layouts (encoder stages 1 and 2 — the 2-stage encoder cuts the InternViT
  tower between its layers —, LLM stages 1 and 2, ``1f1b`` / ``entrain`` / ``dip``, ``--freeze vit`` on
  ``dip`` 2+2, where each process still trains an LLM stage),
  two samples of different tile counts packed per microbatch, forked gloo workers; the step's loss, the
  gradient norm and every gradient before and after clipping equal the single-process fp64 oracle
  (transformers' class, every sample alone) at rel 1e-5.
* ``entrain train --model-path`` on 2 ranks with ``--lr 0``: the reported loss is the oracle's, and
  ``entrain export`` writes one folder ``from_pretrained`` loads with every tensor equal to the input
  checkpoint's (no missing or unexpected tensor).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from entrain.core.costs.presets import build_cost_model
from entrain.core.workload.samples import SampleMeta
from entrain.models.families.base import ModelSource
from entrain.models.families.internvl.model import rows_to_tiles
from entrain.models.families.registry import family_of_source
from tests.models.internvl_tiny import PATCH_PX, save_internvl

from .cases import MAX_GRAD_NORM, SEED, batch_metas
from .families import FamilyModel, assert_ranks_match, train_cases, transformers_step
from .harness import ReferenceStep, run_workers

# (name, system, encoder stages, llm stages, encoder frozen)
CASES_BY_WORLD = {
    2: [("1f1b-1+1", "1f1b", 1, 1, False), ("entrain-1+1", "entrain", 1, 1, False),
        ("dip-2+2-frozen-vit", "dip", 2, 2, True)],
    4: [("entrain-2+2", "entrain", 2, 2, False)],
}  # fmt: skip
NUM_MICROBATCHES = 4
"""Of the 8-sample batch: two samples packed per microbatch."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """The tiny Qwen3-LLM checkpoint (tied embeddings, trained untied)."""
    return str(save_internvl(tmp_path_factory.mktemp("internvl") / "tiny", text="qwen3"))


def family_model(folder: str) -> FamilyModel:
    source = ModelSource(model_path=folder)
    family = family_of_source(source)
    cfg, _ = family.runtime_config(source)
    rule = family.image_rule(cfg.shape, None, None)
    metas = {m.id: replace(m, vision=rule) for m in batch_metas()}
    return FamilyModel("internvl", family, cfg, build_cost_model(cfg.shape, "cpu-tiny"), metas)


def pixel_values(renderer, sid: str) -> torch.Tensor:
    """transformers' ``pixel_values`` of one rendered sample: ``[tiles, 3, S, S]``, images in order."""
    tiles = sum(g[0] for g in renderer.sample(sid).grid_thw)
    return rows_to_tiles(renderer.patches(sid), tiles, 3, PATCH_PX)


def oracle_step(fm: FamilyModel, *, frozen_encoder: bool, max_grad_norm: float | None) -> ReferenceStep:
    """transformers' ``InternVLForConditionalGeneration`` in fp64, every sample alone: ``loss =
    sum(token CE) / label tokens of the batch``, then global-norm clipping."""
    ids = sorted(fm.metas)
    torch.set_num_threads(1)  # tiny tensors: more threads only contend on a loaded machine
    hf = fm.build(frozen_encoder=frozen_encoder).to(torch.float64).hf
    renderer = fm.renderer(torch.float64)

    def inputs(sid: str, s) -> dict:
        return {"pixel_values": pixel_values(renderer, sid)} if s.grid_thw else {}

    return transformers_step(hf, renderer, ids, inputs, max_grad_norm=max_grad_norm)


@pytest.fixture(scope="module")
def oracles(folder) -> dict[bool, ReferenceStep]:
    fm = family_model(folder)
    return {
        frozen: oracle_step(fm, frozen_encoder=frozen, max_grad_norm=MAX_GRAD_NORM)
        for frozen in (False, True)
    }


@pytest.mark.parametrize("world", sorted(CASES_BY_WORLD))
def test_pipeline_gradients_match_transformers(world, folder, oracles, tmp_path):
    fm = family_model(folder)
    cases = []
    for name, system, enc, llm, frozen in CASES_BY_WORLD[world]:
        plan = fm.plan(system, enc, llm, 1, NUM_MICROBATCHES)
        assert plan.layout.world_size == world and len(plan.layout.stages) == enc + llm, name
        if enc == 2:  # the cut passes InternViT hidden states (CLS included), not image features
            assert 1 <= plan.layout.stages[0].end_layer <= fm.cfg.shape.vision.num_layers, plan.layout.stages
        tiles = [[sum(g[0] for g in fm.family.image_grids(fm.cfg, fm.metas[i])) for i in mb.llm_subs[0]]
                 for mb in plan.iterations[0].microbatches[0]]  # fmt: skip
        assert any(len(set(t)) > 1 for t in tiles), (
            f"{name}: no microbatch packs different tile counts {tiles}"
        )
        cases.append((name, plan, frozen))
    results = run_workers(train_cases, world, tmp_path, fm, cases)
    for name, _, _, _, frozen in CASES_BY_WORLD[world]:
        ref = oracles[frozen]
        assert ref.grad_norm > MAX_GRAD_NORM, f"{name}: clipping would not be exercised"
        assert_ranks_match(name, [r[name] for r in results], ref, tol=1e-5)
    frozen = set(oracles[False].grads) - set(oracles[True].grads)
    assert any(n.startswith("model.vision_tower.") for n in frozen) and not any(
        "projector" in n for n in frozen
    )


def test_train_at_lr_0_reports_the_oracle_loss_and_exports_the_input_checkpoint(folder, tmp_path, capsys):
    from transformers import InternVLForConditionalGeneration

    from entrain.cli.main import main

    from .cli_ranks import run_ranks

    run, exported = tmp_path / "run", tmp_path / "export"
    argv = ["train", "--model-path", folder, "--dataset", "skewed", "--hardware", "cpu-tiny", "--global-batch", "4",
            "--microbatch-size", "2", "--steps", "1", "--out", str(run), "--no-progress", "--lr", "0",
            "--seed", str(SEED)]  # fmt: skip
    results = run_ranks(argv, 2, tmp_path / "ranks", timeout_s=120)
    assert [r.exitcode for r in results] == [0, 0], results[0].stderr[-3000:] + results[1].stderr[-3000:]
    assert main(["export", str(run), "--out", str(exported), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert Path(info["vision"]) == exported and (exported / "preprocessor_config.json").is_file()
    source = InternVLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    got, loading = InternVLForConditionalGeneration.from_pretrained(
        exported, dtype=torch.float32, output_loading_info=True
    )
    assert not any(loading[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), loading
    want = source.state_dict()
    for name, t in got.state_dict().items():
        assert torch.equal(t, want[name]), name
    # the step's loss is transformers' on the step's samples
    fm = family_model(folder)
    plan = json.loads((run / "plan.json").read_text())
    rule = fm.family.image_rule(fm.cfg.shape, None, None)
    metas = {s["id"]: SampleMeta.from_json(s["meta"], rule) for s in plan["samples"]}
    ids = [
        i for r in plan["iterations"][0]["assignment"]["replicas"] for mb in r["llm_microbatches"] for i in mb
    ]
    assert any(metas[i].images for i in ids), "the step must hold images"
    ref = oracle_step(replace(fm, metas={i: metas[i] for i in ids}), frozen_encoder=False, max_grad_norm=None)
    loss = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    assert abs(loss - ref.loss) <= 1e-5 * abs(ref.loss), (loss, ref.loss)


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recompute_reruns_each_wrapped_layer_in_the_backward(mode, folder):
    """Every module the family names for ``mode`` (InternViT layers / their attention, decoder layers /
    their self-attention) is on the stage's forward path and runs twice in a step once wrapped."""
    from entrain.models.families.registry import build_stage
    from entrain.runtime.recompute import apply_recompute

    fm = family_model(folder)
    fm = replace(fm, metas={"s0": fm.metas["s0"]})
    renderer, model = fm.renderer(), fm.build()
    stages = [
        build_stage(model, c, 0, len(fm.family.layer_names(fm.cfg.shape, c))) for c in ("encoder", "llm")
    ]
    calls: dict[int, int] = {}
    for stage in stages:
        mods = fm.family.recompute_modules(stage, mode)
        assert len(mods) == 2, mode  # the tiny model's two InternViT / two decoder layers
        for m in mods:
            calls[id(m)] = 0
            m.forward = _counting(m.forward, calls, id(m))
        assert apply_recompute(stage, mode) == 2
    feats = stages[0](renderer.patches("s0"), renderer.grid_thw(["s0"]))
    stages[1](feats, renderer.llm_batch(["s0"], 1.0)).backward()
    assert sorted(calls.values()) == [2] * 4, calls


def _counting(forward, calls: dict, key: int):
    def run(*args, **kwargs):
        calls[key] += 1
        return forward(*args, **kwargs)

    return run
