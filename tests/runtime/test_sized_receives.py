"""Forward messages sized from the plan: once a stage's first messages have shown their parts' widths
and dtypes, the receiver posts every header and data of its later messages at once, with no header
read on the host (no host synchronisation per message on a GPU), and the gradients stay exact."""

from __future__ import annotations

import torch

from entrain.core.ir.p2p import Comm, rank_program
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm
from entrain.runtime.data import SampleRenderer
from entrain.runtime.trainer import OptimConfig, PipelineTrainer

from .cases import MAX_GRAD_NORM, SEED, batch_metas, plan_for, works
from .harness import assert_matches_reference, reference_step, run_workers, train_step_before_clip


def _forward_receives(plan, rank: int) -> int:
    """Forward messages ``rank`` receives from other ranks in a step."""
    program = rank_program(plan.layout, plan.iterations[0], rank)
    return len({(op.peer, op.message) for c in program if isinstance(c, Comm) for b in c.batches
                for op in b.ops if not op.send and op.message.kind == "F"})  # fmt: skip


def _evaluate_then_train(env, plan, metas):
    cfg = get_model_config("tiny")
    renderer = SampleRenderer(cfg, dict(metas), seed=SEED, dtype=torch.float64)
    trainer = PipelineTrainer(layout=plan.layout, model=build_vlm(cfg, seed=SEED, dtype=torch.float64), env=env,
                              renderer=renderer, optim=OptimConfig(max_grad_norm=MAX_GRAD_NORM))  # fmt: skip
    trainer.evaluate(plan.iterations[0])  # the first messages: read with their headers
    learned = trainer.transport.header_reads
    result, before = train_step_before_clip(trainer, plan.iterations[0])
    reads = trainer.transport.header_reads - learned
    return before, trainer.named_grads(), result.loss, result.grad_norm, learned, reads


def test_forward_messages_sized_from_the_plan_read_no_header(tmp_path):
    """1F1B 1+2 on three ranks (an encoder -> LLM message and an LLM -> LLM one): the validation pass
    reads headers, the training step none, and its gradients equal the single-process reference."""
    metas = {m.id: m for m in batch_metas()}
    plan = plan_for("1f1b", 1, 2, 1, 4, works(list(metas.values())))
    results = run_workers(_evaluate_then_train, 3, tmp_path, plan, metas)
    receives = [_forward_receives(plan, r) for r in range(3)]
    assert receives[0] == 0 and min(receives[1:]) >= 4
    learned, reads = [r[4] for r in results], [r[5] for r in results]
    assert learned[1] >= 2 and learned[2] >= 2, learned
    assert reads == [0, 0, 0], f"header reads in the training step per rank: {reads}"
    before, after = {}, {}
    for r in results:
        before.update(r[0])
        after.update(r[1])
    model = build_vlm(get_model_config("tiny"), seed=SEED, dtype=torch.float64)
    ref = reference_step(
        model, get_model_config("tiny"), metas, sorted(metas), seed=SEED, max_grad_norm=MAX_GRAD_NORM
    )
    loss, norm = results[0][2], results[0][3]
    assert_matches_reference("1f1b-1+2 sized", before=before, after=after, loss=loss, grad_norm=norm, ref=ref,
                             tol=1e-10)  # fmt: skip
