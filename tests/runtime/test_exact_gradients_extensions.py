"""Entrain's extensions run exactly: a ramped Plan (first and last microbatches cut into
sub-microbatches), boundary-sharing layouts (one rank holds the last encoder stage and the first
LLM stage), split weight gradients (every backward as ``I`` then ``W``, on every stage kind:
first encoder stage, a stage that feeds a local one, the LLM's last), the two-resource
assignment (microbatches other than the paper's), twice the requested microbatch count, the deferral pairs in another order and the memory split (encoder microbatches cut
into more sub-microbatches so a fully recomputing encoder stays within a small budget) give the
single-process reference gradients before and after clipping and its grad norm (fp32, < 1e-5
relative per tensor), with deferrals and clipping on. One forked 2-rank gloo group runs every case."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from entrain.core.costs.presets import build_cost_model
from entrain.core.ir.plan import ComponentLayout, Layout, Plan, StageSpec
from entrain.core.ir.validate import validate_plan
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm
from entrain.runtime.data import SampleRenderer
from entrain.runtime.planning import make_plan
from entrain.runtime.trainer import OptimConfig, PipelineTrainer

from .cases import MAX_GRAD_NORM, SEED, batch_metas, one_sample_budget_bytes, plan_for, works
from .harness import assert_matches_reference, reference_step, run_workers, train_step_before_clip

K = 4
TOL = 1e-5


def _shared_layout(stages: list[tuple], enc_pp: int, llm_pp: int) -> Layout:
    return Layout(
        dp=1,
        microbatch_size=2,
        num_microbatches=K,
        components={"encoder": ComponentLayout(pp=enc_pp), "llm": ComponentLayout(pp=llm_pp)},
        stages=tuple(StageSpec(i, *st) for i, st in enumerate(stages)),
    )


LAYOUTS = {
    # rank 0: the whole encoder + embed_tokens, layers.0, layers.1; rank 1: norm, lm_head, loss
    "shared-rank0": _shared_layout([("encoder", 0, 4, 0), ("llm", 0, 3, 0), ("llm", 3, 6, 1)], 1, 2),
    # rank 0: patch_embed, blocks.0; rank 1: blocks.1, merger + the whole LLM
    "shared-rank1": _shared_layout([("encoder", 0, 2, 0), ("encoder", 2, 4, 1), ("llm", 0, 6, 1)], 2, 1),
    # the memory check's per-layer recomputation (sim.memory_fit.escalate): rank 0 holds the encoder as
    # two stages, patch_embed + blocks.0 recomputed in full, blocks.1 + merger selectively
    "split-rank0": _shared_layout(
        [("encoder", 0, 2, 0, "full"), ("encoder", 2, 4, 0, "selective"), ("llm", 0, 6, 1)], 1, 1
    ),
}
# the disjoint 1+1 layout with full recomputation on the encoder: each sub's backward re-runs its blocks
FULL_RECOMPUTE_ENCODER = replace(
    _shared_layout([("encoder", 0, 4, 0), ("llm", 0, 6, 1)], 1, 1),
    stages=(
        StageSpec(0, "encoder", 0, 4, 0, recompute="full"),
        StageSpec(1, "llm", 0, 6, 1),
    ),
)
LAYOUTS["full-recompute-encoder"] = FULL_RECOMPUTE_ENCODER
# a budget where one sample's recomputation transient fits on the encoder rank but a two-sample
# microbatch's does not: Entrain's memory split cuts those microbatches into singles
MEMORY_SPLIT = {
    "memory_budget_bytes": one_sample_budget_bytes(
        make_plan(
            "entrain",
            FULL_RECOMPUTE_ENCODER,
            [works(batch_metas())],
            build_cost_model("tiny", "cpu-tiny"),
            {"memory_split": False},
        )
    )
}
# (name, layout or None for the disjoint 1+1 runtime layout, schedule options)
CASES = [
    ("ramp-1+1", None, {"ramp_microbatches": 1}),
    ("ramp-1+1-4pieces", None, {"ramp_microbatches": 1, "ramp_pieces": 4}),
    ("shared-rank0", "shared-rank0", {}),
    ("shared-rank0-ramp", "shared-rank0", {"ramp_microbatches": 1}),
    ("shared-rank1-ramp", "shared-rank1", {"ramp_microbatches": 1}),
    ("split-1+1-ramp", None, {"ramp_microbatches": 1, "split_weight_grads": True}),
    ("split-shared-rank0", "shared-rank0", {"split_weight_grads": True}),
    ("split-shared-rank0-per-b", "shared-rank0", {"split_weight_grads": True, "backward_order": "per-b"}),
    ("split-shared-rank1-ramp", "shared-rank1", {"ramp_microbatches": 1, "split_weight_grads": True}),
    ("two-resource-1+1", None, {"assignment": "two-resource"}),
    ("double-count-1+1", "1+1, K 2", {"microbatch_count": "double"}),  # 4 microbatches of 2 samples
    ("pair-order-1+1-split", None, {"pair_order": "light first", "split_weight_grads": True}),
    ("memory-split-1+1", "full-recompute-encoder", MEMORY_SPLIT),
    ("memory-split-1+1-split-wg", "full-recompute-encoder", {**MEMORY_SPLIT, "split_weight_grads": True}),
    ("split-rank0-recompute", "split-rank0", {"split_weight_grads": True}),
]


def _plan(layout_name: str | None, options: dict) -> Plan:
    cost = build_cost_model("tiny", "cpu-tiny")
    batch = works(batch_metas())
    if layout_name is None:
        return plan_for("entrain", 1, 1, 1, K, batch, options)
    if layout_name == "1+1, K 2":  # the disjoint 1+1 runtime layout at half the microbatch count
        return plan_for("entrain", 1, 1, 1, 2, batch, options)
    return make_plan("entrain", LAYOUTS[layout_name], [batch], cost, options)


def _train(env, cases):
    cfg = get_model_config("tiny")
    metas = {m.id: m for m in batch_metas()}
    out = {}
    for name, plan in cases:
        model = build_vlm(cfg, seed=SEED, dtype=torch.float32)
        renderer = SampleRenderer(cfg, dict(metas), seed=SEED, dtype=torch.float32)
        trainer = PipelineTrainer(
            layout=plan.layout,
            model=model,
            env=env,
            renderer=renderer,
            optim=OptimConfig(max_grad_norm=MAX_GRAD_NORM),
        )
        result, before = train_step_before_clip(trainer, plan.iterations[0])
        out[name] = (before, trainer.named_grads(), result.loss, result.grad_norm)
    return out


@pytest.fixture(scope="module")
def reference():
    cfg = get_model_config("tiny")
    metas = {m.id: m for m in batch_metas()}
    model = build_vlm(cfg, seed=SEED, dtype=torch.float64)
    return reference_step(model, cfg, metas, sorted(metas), seed=SEED, max_grad_norm=MAX_GRAD_NORM)


def test_ramped_and_boundary_sharing_plans_give_reference_gradients(reference, tmp_path):
    cases = []
    for name, layout_name, options in CASES:
        plan = _plan(layout_name, options)
        validate_plan(plan)
        assert plan.layout.world_size == 2, name
        it = plan.iterations[0]
        (rep,) = it.assignment.replicas
        assert rep.deferrals, f"{name}: the test batch must make Entrain defer samples"
        mbs = it.microbatches[0]
        if options.get("ramp_microbatches"):
            # the last microbatch is cut (a deferred sample lands in one of its pieces), the middle
            # ones are not; the first keeps its deferred encoder sub last
            assert len(mbs[-1].llm_subs) >= 2, name
            deferred = {d.id for d in rep.deferrals}
            assert any(deferred & set(sub) for sub in mbs[-1].llm_subs), name
            assert all(len(m.llm_subs) == 1 for m in mbs[1:-1]), name
            assert set(mbs[0].encoder_subs[-1]) <= deferred, name
        if "memory_budget_bytes" in options:  # encoder microbatches cut beyond Entrain's own subs
            assert plan.options["memory_split"]["cuts"][0][0], name
            whole = _plan(layout_name, {**options, "memory_split": False}).iterations[0].microbatches[0]
            assert sum(len(m.encoder_subs) for m in mbs) > sum(len(m.encoder_subs) for m in whole), name
        if options.get("assignment") == "two-resource":  # the Plan runs microbatches unlike the paper's
            assert rep != _plan(layout_name, {}).iterations[0].assignment.replicas[0], name
        if options.get("microbatch_count") == "double":  # twice the requested 2 microbatches
            assert rep.k_eff == len(mbs) == 4, name
        if "pair_order" in options:  # the same microbatches, the deferral pairs run in another order
            paper = _plan(layout_name, {}).iterations[0].assignment.replicas[0]
            assert rep.execution_order != paper.execution_order, name
            assert replace(rep, execution_order=paper.execution_order) == paper, name
        kinds = {a.kind.value for acts in it.actions.values() for a in acts}
        assert ("B" not in kinds and {"I", "W"} <= kinds) == bool(options.get("split_weight_grads")), name
        if layout_name is not None and layout_name.startswith("shared"):
            e = plan.layout.num_encoder_stages
            assert plan.layout.stages[e - 1].pp_rank == plan.layout.stages[e].pp_rank, name
            if options.get("split_weight_grads"):  # the fused rank runs the backward order asked for
                assert plan.options["backward_order"] == options.get("backward_order", "slot"), name
            if options.get("backward_order") == "per-b":  # the fused rank's I/W order differs from slot's
                slot = _plan(layout_name, {**options, "backward_order": "slot"}).iterations[0]
                assert it.actions != slot.actions, name
        cases.append((name, plan))
    results = run_workers(_train, 2, tmp_path, cases)
    assert reference.grad_norm > MAX_GRAD_NORM, "clipping would not be exercised"
    for name, _, _ in CASES:
        before, after = {}, {}
        for rank_result in results:
            before.update(rank_result[name][0])
            after.update(rank_result[name][1])
        _, _, loss, grad_norm = results[0][name]
        assert_matches_reference(
            name, before=before, after=after, loss=loss, grad_norm=grad_norm, ref=reference, tol=TOL
        )
