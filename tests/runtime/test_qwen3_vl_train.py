"""Qwen3-VL through the runtime, against transformers' own ``Qwen3VLForConditionalGeneration``: forked
gloo ranks train one step of the skewed batch (two samples packed per microbatch) on pipeline
layouts whose cuts fall inside the vision tower's DeepStack span (a tapped feature crosses encoder
stages) and between the LLM layers that add the features (a part rides past a stage), ``1f1b`` and
``entrain``, ``--freeze vit``; the loss, the gradient norm and every gradient before and after
clipping equal the single-process fp64 oracle (transformers' class, every sample alone) at rel 1e-5.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from entrain.core.costs.presets import build_cost_model
from entrain.models.families.base import ModelSource
from entrain.models.families.registry import family_of_source
from tests.models.qwen3_vl_tiny import save_whole

from .cases import MAX_GRAD_NORM, batch_metas
from .families import FamilyModel, assert_ranks_match, oracle_step, train_cases
from .harness import run_workers

# (name, system, (encoder cuts), (llm cuts), encoder frozen); the tiny tower taps blocks 0, 2, 3
# (layers 1, 3, 4 of [patch_embed, blocks.0-4, merger]); decoder layers 0-2 (list 1-3) add them
CASES_BY_WORLD = {
    4: [("entrain-2+2-taps-split", "entrain", (3,), (2,), False),  # deepstack_0 crosses; 1, 2 ride past
        ("1f1b-2+2-frozen-vit", "1f1b", (4,), (3,), True)],  # deepstack_0, 1 cross; 2 rides past
}  # fmt: skip
NUM_MICROBATCHES = 4


@pytest.fixture(scope="module")
def fm(tmp_path_factory) -> FamilyModel:
    folder = save_whole(tmp_path_factory.mktemp("qwen3_vl") / "tiny")
    source = ModelSource(model_path=str(folder))
    family = family_of_source(source)
    cfg, _ = family.runtime_config(source)
    rule = family.image_rule(cfg.shape, None, None)
    metas = {m.id: replace(m, vision=rule) for m in batch_metas()}
    return FamilyModel("qwen3_vl", family, cfg, build_cost_model(cfg.shape, "cpu-tiny"), metas)


def with_cuts(plan, cost, cuts: dict[str, tuple[int, ...]]):
    """``plan`` with each component's stages cut at ``cuts`` (stage counts kept) and every stage's
    message parts as the cost model declares them."""
    stages, bounds = [], {}
    for c, cs in cuts.items():
        n = len(cost.component(c).layers)
        bounds[c] = list(zip([0, *cs], [*cs, n]))
    seen = {c: 0 for c in cuts}
    for s in plan.layout.stages:
        if cuts[s.component]:
            first, end = bounds[s.component][seen[s.component]]
            s = dataclasses.replace(s, first_layer=first, end_layer=end)
        seen[s.component] += 1
        stages.append(s)
    layout = cost.layout_with_parts(dataclasses.replace(plan.layout, stages=tuple(stages)))
    return dataclasses.replace(plan, layout=layout)


@pytest.fixture(scope="module")
def oracles(fm):
    return {
        frozen: oracle_step(fm, max_grad_norm=MAX_GRAD_NORM, frozen_encoder=frozen)
        for frozen in (False, True)
    }


@pytest.mark.parametrize("world", sorted(CASES_BY_WORLD))
def test_pipeline_gradients_match_transformers(world, fm, oracles, tmp_path):
    cases = []
    for name, system, enc_cuts, llm_cuts, frozen in CASES_BY_WORLD[world]:
        enc, llm = len(enc_cuts) + 1, len(llm_cuts) + 1
        plan = with_cuts(
            fm.plan(system, enc, llm, 1, NUM_MICROBATCHES), fm.cost, {"encoder": enc_cuts, "llm": llm_cuts}
        )
        assert plan.layout.world_size == world, name
        if enc_cuts:
            assert any(p.name.startswith("deepstack_") for p in plan.layout.stages[0].parts), (
                plan.layout.stages
            )
        cases.append((name, plan, frozen))
    results = run_workers(train_cases, world, tmp_path, fm, cases)
    for name, *_, frozen in CASES_BY_WORLD[world]:
        ref = oracles[frozen]
        assert ref.grad_norm > MAX_GRAD_NORM, f"{name}: clipping would not be exercised"
        assert_ranks_match(name, [r[name] for r in results], ref, tol=1e-5)
    frozen = set(oracles[False].grads) - set(oracles[True].grads)
    assert any(".blocks." in n for n in frozen) and not any("merger" in n for n in frozen)
