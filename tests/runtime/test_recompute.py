"""Activation recomputation in the runtime: a Plan whose stages recompute
(``StageSpec.recompute``) trains to the same gradients as the Plan without it, on 2 forked gloo ranks,
and the measured peak tensor memory of the step drops (every
live CPU tensor storage, activations and recomputation transients included: ``harness.PeakTensorMemory``).

Every other model family (``families.FAMILY_MODELS``) recomputes the family's own blocks
(``ModelFamily.recompute_modules``) on the pipeline layout ``1f1b`` 1+1: gradients equal those
without recomputation."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from entrain.core.workload.samples import SampleMeta
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm
from entrain.runtime.data import SampleRenderer
from entrain.runtime.recompute import recomputed_modules
from entrain.runtime.trainer import OptimConfig, PipelineTrainer

from .cases import SEED, plan_for, works
from .families import FAMILY_MODELS, family_model
from .harness import PeakTensorMemory, relative_errors, run_workers

MODES = ("none", "selective", "full")


def _metas() -> list[SampleMeta]:
    """Larger images than the gradient tests' batch, so activations dominate the step's memory."""
    rng = random.Random(3)
    return [
        SampleMeta(f"r{i}", ((rng.choice([224, 280]), rng.choice([224, 336])),), rng.choice([600, 900]))
        for i in range(8)
    ]


def _train(env, plans):
    """Per named Plan: (this rank's gradients, its peak tensor bytes in the step, recomputed modules)."""
    cfg = get_model_config("tiny")
    metas = {m.id: m for m in _metas()}
    out = {}
    for name, plan in plans.items():
        model = build_vlm(cfg, seed=SEED, dtype=torch.float32)
        renderer = SampleRenderer(cfg, dict(metas), seed=SEED, dtype=torch.float32)
        trainer = PipelineTrainer(
            layout=plan.layout, model=model, env=env, renderer=renderer, optim=OptimConfig(max_grad_norm=None)
        )
        stages = plan.layout.stages
        wrapped = sum(len(recomputed_modules(m, stages[s].recompute)) for s, m in trainer.modules.items())
        with PeakTensorMemory() as tracker:
            trainer.train_step(plan.iterations[0])
        out[name] = (trainer.named_grads(), tracker.peak, wrapped)
    return out


def _with_recompute(base, mode: str):
    stages = tuple(replace(s, recompute=mode) for s in base.layout.stages)
    return replace(base, layout=replace(base.layout, stages=stages))


def test_recompute_keeps_gradients_and_lowers_peak_memory(tmp_path):
    base = plan_for("1f1b", 1, 1, 1, 4, works(_metas()))
    plans = {m: _with_recompute(base, m) for m in MODES}
    results = run_workers(_train, 2, tmp_path, plans)
    grads = {m: {k: v for r in results for k, v in r[m][0].items()} for m in MODES}
    peaks = {m: [r[m][1] for r in results] for m in MODES}
    for mode in ("selective", "full"):
        assert all(r[mode][2] > 0 for r in results), f"{mode}: no module was wrapped"
        errors = relative_errors(grads[mode], grads["none"])
        worst = max(errors, key=errors.get)
        assert errors[worst] < 1e-6, f"{mode}: {worst} relative error {errors[worst]:.3g}"
    for rank in range(2):
        assert peaks["full"][rank] < peaks["selective"][rank] < peaks["none"][rank], (rank, peaks)
    print({m: [f"{p / 1e6:.1f} MB" for p in v] for m, v in peaks.items()})


def _train_family(env, fm, plans):
    """Per named Plan: (this rank's gradients, modules its stages recompute)."""
    out = {}
    for name, plan in plans.items():
        trainer = PipelineTrainer(layout=plan.layout, model=fm.build(), env=env, renderer=fm.renderer(),
                                  optim=OptimConfig(max_grad_norm=None))  # fmt: skip
        stages = plan.layout.stages
        wrapped = sum(len(recomputed_modules(m, stages[s].recompute)) for s, m in trainer.modules.items())
        trainer.train_step(plan.iterations[0])
        out[name] = (trainer.named_grads(), wrapped)
    return out


@pytest.mark.parametrize("family", FAMILY_MODELS)
def test_every_family_recompute_keeps_gradients(family, tmp_path):
    fm = family_model(family, tmp_path / "model")
    base = fm.plan("1f1b", 1, 1, 1, 4)
    results = run_workers(_train_family, 2, tmp_path / "w", fm, {m: _with_recompute(base, m) for m in MODES})
    grads = {m: {k: v for r in results for k, v in r[m][0].items()} for m in MODES}
    assert len(grads["none"]) > 20
    for mode in ("selective", "full"):
        assert all(r[mode][1] > 0 for r in results), f"{family} {mode}: no module was wrapped"
        errors = relative_errors(grads[mode], grads["none"])
        worst = max(errors, key=errors.get)
        assert errors[worst] < 1e-6, f"{family} {mode}: {worst} relative error {errors[worst]:.3g}"
