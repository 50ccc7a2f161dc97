"""The GPU peak memory a step reports is its own: ``train_step`` resets
torch's peak statistics before its work (a second system in the same process starts from zero too).
CUDA is faked: ``torch.cuda.reset_peak_memory_stats`` is recorded, the trainer runs on CPU."""

from __future__ import annotations

import torch

from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm
from entrain.runtime import trainer as trainer_module
from entrain.runtime.data import SampleRenderer
from entrain.runtime.trainer import OptimConfig, PipelineTrainer, reset_peak_memory

from .cases import SEED, batch_metas, plan_for, works
from .harness import run_workers


def test_reset_asks_cuda_for_the_device_and_leaves_the_cpu_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", calls.append)
    reset_peak_memory(torch.device("cpu"))
    reset_peak_memory(torch.device("cuda", 1))
    assert calls == [torch.device("cuda", 1)]


def _two_steps(env, plan):
    events = []
    trainer_module.reset_peak_memory = lambda device: events.append("reset")  # forked worker
    cfg = get_model_config("tiny")
    metas = {m.id: m for m in batch_metas()}
    trainer = PipelineTrainer(
        layout=plan.layout,
        model=build_vlm(cfg, seed=SEED),
        env=env,
        renderer=SampleRenderer(cfg, metas, seed=SEED),
        optim=OptimConfig(),
    )
    forward_backward = trainer.forward_backward

    def recorded(it):
        events.append("step work")
        return forward_backward(it)

    trainer.forward_backward = recorded
    for _ in range(2):
        trainer.train_step(plan.iterations[0])
    return events


def test_every_step_resets_the_peak_before_its_work(tmp_path):
    plan = plan_for("dip", 1, 1, 1, 4, works(batch_metas()))
    events = run_workers(_two_steps, 1, tmp_path, plan)[0]
    assert events == ["reset", "step work", "reset", "step work"]
