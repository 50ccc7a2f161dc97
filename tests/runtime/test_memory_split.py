"""Entrain's memory split in the runtime (issue 10, requirement 3): with full recomputation on the
encoder and a budget that holds one sample's recomputation transient but not a whole microbatch's, the
Plan cuts its encoder microbatches into sub-microbatches; on 2 forked gloo ranks it trains to the
gradients of the uncut Plan, and the encoder rank's measured peak tensor memory drops, as the
simulator predicts (``harness.PeakTensorMemory``)."""

from __future__ import annotations

from dataclasses import replace

import torch

from entrain.core.presets import build_cost_model
from entrain.models.config import get_model_config
from entrain.models.vlm import build_vlm
from entrain.runtime.data import SampleRenderer
from entrain.runtime.planning import make_plan
from entrain.runtime.trainer import OptimConfig, PipelineTrainer
from entrain.sim.executor import simulate_plan

from .cases import SEED, one_sample_budget_bytes, plan_for, works
from .harness import PeakTensorMemory, relative_errors, run_workers
from .test_recompute import _metas

K = 2  # 4 samples per microbatch


def _plans():
    cost = build_cost_model("tiny", "cpu-tiny")
    batch = works(_metas())
    base = plan_for("entrain", 1, 1, 1, K, batch)
    stages = tuple(
        replace(s, recompute="full") if s.component == "encoder" else s for s in base.layout.stages
    )
    layout = replace(base.layout, stages=stages)
    whole = make_plan("entrain", layout, [batch], cost, {"memory_split": False})
    budget = one_sample_budget_bytes(whole)
    cut = make_plan("entrain", layout, [batch], cost, {"memory_budget_bytes": budget})
    return {"whole": whole, "cut": cut}, cost


def _train(env, plans):
    cfg = get_model_config("tiny")
    metas = {m.id: m for m in _metas()}
    out = {}
    for name, plan in plans.items():
        model = build_vlm(cfg, seed=SEED, dtype=torch.float32)
        renderer = SampleRenderer(cfg, dict(metas), seed=SEED, dtype=torch.float32)
        trainer = PipelineTrainer(
            layout=plan.layout, model=model, env=env, renderer=renderer, optim=OptimConfig(max_grad_norm=None)
        )
        with PeakTensorMemory() as tracker:
            trainer.train_step(plan.iterations[0])
        out[name] = (trainer.named_grads(), tracker.peak)
    return out


def test_cut_encoder_microbatches_keep_gradients_and_lower_the_encoder_peak(tmp_path):
    plans, cost = _plans()
    subs = {n: sum(len(m.encoder_subs) for m in p.iterations[0].microbatches[0]) for n, p in plans.items()}
    assert subs["cut"] > subs["whole"] and plans["cut"].options["memory_split"]["cuts"][0][0], subs
    predicted = {n: simulate_plan(p, cost)[0].replicas[0].peak_bytes[0] for n, p in plans.items()}
    assert predicted["cut"] < predicted["whole"], predicted
    results = run_workers(_train, 2, tmp_path, plans)
    grads = {n: {k: v for r in results for k, v in r[n][0].items()} for n in plans}
    errors = relative_errors(grads["cut"], grads["whole"])
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-6, f"{worst} relative error {errors[worst]:.3g}"
    measured = {n: results[0][n][1] for n in plans}
    assert measured["cut"] < measured["whole"], measured
    print(
        {n: f"{p / 1e6:.2f} MB" for n, p in measured.items()},
        {n: f"{p / 1e6:.2f} MB" for n, p in predicted.items()},
    )
