"""The DP gradient all-reduce runs in buckets (``entrain.runtime.grad_buckets``)
launched during the pipeline, each only after every backward that adds to its parameters, in the
same bucket order on every replica; the gradients still equal the single-process reference.

Two cases: DIP on 2 processes (DP 2, every stage on each rank, whole ``B`` backwards: buckets start
inside the last backward, from the post-accumulate hooks) and Entrain 1+1 with DP 2 and split
``I`` / ``W`` backwards on 4 processes (``W`` accumulates by hand: buckets start between actions)."""

from __future__ import annotations

import pytest
import torch

from entrain.core.ir.plan import ActionKind
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm
from entrain.runtime import grad_buckets
from entrain.runtime.data import SampleRenderer
from entrain.runtime.trainer import OptimConfig, PipelineTrainer

from .cases import MAX_GRAD_NORM, SEED, batch_metas, plan_for, works
from .harness import assert_matches_reference, run_workers, train_step_before_clip
from .test_exact_gradients import _split_backward
from .test_exact_gradients_extensions import reference  # noqa: F401 - the fp64 reference step

SMALL_BUCKET_BYTES = 64 * 1024
"""Small enough for the tiny model to fill several buckets per rank."""


def _train(env, plan):
    grad_buckets.BUCKET_BYTES = SMALL_BUCKET_BYTES  # forked worker: its own module state
    cfg = get_model_config("tiny")
    metas = {m.id: m for m in batch_metas()}
    renderer = SampleRenderer(cfg, metas, seed=SEED, dtype=torch.float32)
    trainer = PipelineTrainer(
        layout=plan.layout,
        model=build_vlm(cfg, seed=SEED, dtype=torch.float32),
        env=env,
        renderer=renderer,
        optim=OptimConfig(max_grad_norm=MAX_GRAD_NORM),
    )
    result, before = train_step_before_clip(trainer, plan.iterations[0])
    gb = trainer.grad_buckets
    stages = [sorted({gb.stage_of[id(p)] for p in b.params}) for b in gb.buckets]
    actions = plan.iterations[0].actions[trainer.place.plan_rank]
    return before, trainer.named_grads(), result.loss, result.grad_norm, gb.launches, stages, actions


def _last_backward(actions, stage: int) -> int:
    return max(
        i for i, a in enumerate(actions) if a.stage == stage and a.kind in (ActionKind.B, ActionKind.W)
    )


def _check_launches(launches, stages, actions, *, want_hook: bool) -> None:
    assert len(stages) > 1, "the test needs several buckets per rank"
    assert [x.bucket for x in launches] == list(range(len(stages))), "buckets launch once each, in order"
    for x in launches:
        last = max(_last_backward(actions, s) for s in stages[x.bucket])
        # a hook launch runs inside action number actions_done; any other after actions_done actions
        assert last <= x.actions_done - (0 if x.in_hook else 1), (
            f"bucket {x.bucket} launched before its last backward"
        )
    # every parameter of these plans gets a gradient: no bucket waits for the end-of-step flush
    assert not any(x.flushed for x in launches), "a bucket waited for the flush after the last action"
    assert any(x.in_hook for x in launches) == want_hook


@pytest.mark.parametrize(
    ("system", "world", "split"),
    [("dip", 2, False), ("entrain", 4, True)],
    ids=["dip-dp2-B", "entrain-dp2-IW"],
)
def test_buckets_start_early_and_gradients_match_reference(system, world, split, reference, tmp_path):  # noqa: F811
    plan = plan_for(system, 1, 1, 2, 2, works(batch_metas()))
    if split:
        plan = _split_backward(plan)
    assert plan.layout.world_size == world and plan.layout.dp == 2
    results = run_workers(_train, world, tmp_path, plan)
    before, after = {}, {}
    for rank_before, rank_after, *_ in results:
        before.update(rank_before)
        after.update(rank_after)
    _, _, loss, grad_norm, *_ = results[0]
    assert_matches_reference(
        system, before=before, after=after, loss=loss, grad_norm=grad_norm, ref=reference, tol=1e-5
    )
    for *_, launches, stages, actions in results:
        _check_launches(launches, stages, actions, want_hook=not split)
