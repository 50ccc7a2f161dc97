"""Qwen3-VL-MoE through the runtime, against transformers' own ``Qwen3VLMoeForConditionalGeneration``:
forked gloo ranks train one step of the skewed batch (two samples packed per microbatch) on pipeline
layouts whose LLM cuts put the dense layer, the sparse layers and the loss on different stages, so
the per-sample routing statistics (``router_stats``) are made on one stage, added to on another and
consumed by the loss stage, ``entrain`` and ``1f1b``; the loss with its auxiliary load-balancing
term, the gradient norm and every gradient before and after clipping equal the single-process fp64
oracle (transformers' class, every sample alone, each sample's loss weighted by its share of the
batch's label tokens) at rel 1e-5.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from entrain.core.costs.presets import build_cost_model
from entrain.models.families.base import ModelSource
from entrain.models.families.qwen3_vl_moe.spec import ROUTER_STATS
from entrain.models.families.registry import family_of_source
from tests.models.qwen3_vl_moe_tiny import save_whole

from .cases import MAX_GRAD_NORM, batch_metas
from .families import FamilyModel, _image_inputs, assert_ranks_match, train_cases, transformers_step
from .harness import ReferenceStep, run_workers
from .test_qwen3_vl_train import with_cuts

# (name, system, (encoder cuts), (llm cuts)); encoder [patch_embed, blocks.0-1, merger]; LLM [embed,
# layers.0 (dense), layers.1-3 (sparse), norm, lm_head, loss]
CASES = [
    ("entrain-1+3-stats-cross-twice", "entrain", (), (3, 5)),  # made by 0-1 | added by 2-3 | loss
    ("1f1b-2+2-stats-cross-once", "1f1b", (2,), (4,)),  # made by layers 1-2 | layer 3 adds, loss
]
NUM_MICROBATCHES = 4


@pytest.fixture(scope="module")
def fm(tmp_path_factory) -> FamilyModel:
    folder = save_whole(tmp_path_factory.mktemp("qwen3_vl_moe") / "tiny")
    source = ModelSource(model_path=str(folder))
    family = family_of_source(source)
    assert family.name == "qwen3_vl_moe"
    cfg, _ = family.runtime_config(source)
    rule = family.image_rule(cfg.shape, None, None)
    metas = {m.id: replace(m, vision=rule) for m in batch_metas()}
    return FamilyModel("qwen3_vl_moe", family, cfg, build_cost_model(cfg.shape, "cpu-tiny"), metas)


@pytest.fixture(scope="module")
def oracle(fm) -> ReferenceStep:
    """Every sample alone through transformers' class in fp64: its CE sum over the batch's label tokens
    plus ``router_aux_loss_coef *`` its own ``aux_loss`` (the per-sequence load-balancing loss) times
    its share of the label tokens."""
    ids = sorted(fm.metas)
    hf = fm.build(torch.float64).to(torch.float64)
    renderer = fm.renderer(torch.float64)
    coef = hf.config.text_config.router_aux_loss_coef

    def inputs(sid: str, _sample) -> dict:
        return {"output_router_logits": True, **_image_inputs(fm, renderer, sid, hf)}

    def aux(out, s):
        return coef * out.aux_loss * s.num_labels

    return transformers_step(hf, renderer, ids, inputs, max_grad_norm=MAX_GRAD_NORM, extra_loss=aux)


def test_pipeline_gradients_match_transformers(fm, oracle, tmp_path):
    cases = []
    for name, system, enc_cuts, llm_cuts in CASES:
        enc, llm = len(enc_cuts) + 1, len(llm_cuts) + 1
        plan = with_cuts(
            fm.plan(system, enc, llm, 1, NUM_MICROBATCHES), fm.cost, {"encoder": enc_cuts, "llm": llm_cuts}
        )
        assert plan.layout.world_size == 4, name
        crossing = [s for s in plan.layout.stages if any(p.name == ROUTER_STATS for p in s.parts)]
        assert len(crossing) == len(llm_cuts), (name, plan.layout.stages)  # every LLM cut is past layer 1
        assert any(len(mb.llm_subs[0]) > 1 for mb in plan.iterations[0].microbatches[0]), "no packing"
        cases.append((name, plan, False))
    results = run_workers(train_cases, 4, tmp_path, fm, cases)
    assert oracle.grad_norm > MAX_GRAD_NORM, "clipping would not be exercised"
    for name, *_ in CASES:
        assert_ranks_match(name, [r[name] for r in results], oracle, tol=1e-5)
