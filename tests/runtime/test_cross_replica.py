"""Encoder work moved across data-parallel replicas (``encoder-rebalance``): a sample encoded on one
replica is trained by the LLM of another, its features sent there and their gradients back over the
channels between replicas. Forked gloo ranks, DP 2 x (1 encoder + 1 LLM stage), receiving in gloo's
order and in NCCL's; the gradients, loss and grad norm equal the single-process reference's."""

from __future__ import annotations

import torch

from entrain.core.assignment.batchers.rebalance import moved_samples
from entrain.core.ir.p2p import encoder_pieces
from entrain.core.systems import moves_across_replicas
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm
from entrain.runtime.data import SampleRenderer
from entrain.runtime.trainer import OptimConfig, PipelineTrainer

from .cases import MAX_GRAD_NORM, SEED, batch_metas, plan_for, works
from .harness import assert_matches_reference, reference_step, run_workers, train_step_before_clip

F64 = torch.float64


def _train(env, plan, metas):
    """Per receive order (gloo's gradient receives posted ahead, NCCL's at their actions): the step's
    gradients before and after clipping, loss, grad norm and the forward-only loss."""
    cfg = get_model_config("tiny")
    out = {}
    for order in ("gloo", "nccl"):
        renderer = SampleRenderer(cfg, dict(metas), seed=SEED, dtype=F64)
        trainer = PipelineTrainer(layout=plan.layout, model=build_vlm(cfg, seed=SEED, dtype=F64), env=env,
                                  renderer=renderer, optim=OptimConfig(max_grad_norm=MAX_GRAD_NORM),
                                  cross_replica=True)  # fmt: skip
        trainer.transport.prepost_gradients = order == "gloo"
        val_loss = trainer.evaluate(plan.iterations[0])
        result, before = train_step_before_clip(trainer, plan.iterations[0])
        out[order] = (before, trainer.named_grads(), result.loss, result.grad_norm, val_loss,
                      trainer.transport.num_preposted)  # fmt: skip
    return out


def test_encoder_work_moved_across_replicas_keeps_exact_gradients(tmp_path):
    metas = {m.id: m for m in batch_metas()}
    plan = plan_for("encoder-rebalance", 1, 1, 2, 2, works(list(metas.values())))
    it = plan.iterations[0]
    assert moves_across_replicas("encoder-rebalance")
    moved = moved_samples(it.assignment)
    assert moved and {enc for enc, _ in moved.values()} == {0, 1}, moved  # both ways
    assert encoder_pieces(plan.layout, it)
    results = run_workers(_train, 4, tmp_path, plan, metas)
    cfg = get_model_config("tiny")
    ref = reference_step(build_vlm(cfg, seed=SEED, dtype=F64), cfg, metas, sorted(metas), seed=SEED,
                         max_grad_norm=MAX_GRAD_NORM)  # fmt: skip
    for order in ("gloo", "nccl"):
        before, after = {}, {}
        for r in results:
            before.update(r[order][0])
            after.update(r[order][1])
        _, _, loss, norm, val_loss, _ = results[0][order]
        preposted = sum(r[order][5] for r in results)
        assert (preposted > 0) == (order == "gloo"), (order, preposted)
        assert_matches_reference(f"encoder-rebalance dp2x1+1 {order} order", before=before, after=after, loss=loss,
                                 grad_norm=norm, ref=ref, tol=1e-10)  # fmt: skip
        assert abs(val_loss - ref.loss) < 1e-5 * abs(
            ref.loss
        )  # the forward-only pass, as test_exact_gradients
