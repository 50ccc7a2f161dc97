"""On one GPU: the runtime's gradients on CUDA in fp32 equal the CPU float64
single-process reference, before and after clipping, with the grad norm and the loss (every stage:
the colocated 1-rank layout holds the encoder and the LLM stage); bf16 autocast training on CUDA
keeps the loss finite and falling over a few steps on one batch, and its gradients stay within bf16
rounding of the fp32 ones. One spawned worker runs every scenario (``gpu_harness``)."""

from __future__ import annotations

import math

import pytest
import torch

from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm, set_trainable
from entrain.runtime.data import SampleRenderer
from entrain.runtime.trainer import OptimConfig, PipelineTrainer

from . import test_exact_gradients as exact
from .cases import MAX_GRAD_NORM, SEED, plan_for, works
from .gpu_harness import each_scenario, run_spawned, scenario
from .harness import assert_matches_reference, relative_errors, train_step_before_clip

references = exact.references  # the CPU float64 references (a module fixture)

pytestmark = pytest.mark.gpu

TOL_FP32 = 1e-4
"""Relative error per tensor on CUDA in fp32 (TF32 off): 10x the CPU bound, for reduction orders and
atomics of the GPU kernels."""
TOL_BF16 = 0.05
"""Relative error of all gradients together under bf16 autocast against fp32 (8-bit mantissa)."""
EXACT_CASES = ("dip-1+1", "dip-1+1-frozen-vit", "dip-1+1-text-only")
BF16_STEPS = 6


def _trainer(env, name: str, plan, *, autocast=None, optim: OptimConfig | None = None) -> PipelineTrainer:
    cfg = get_model_config("tiny")
    model = build_vlm(cfg, seed=SEED)
    if "frozen" in name:
        set_trainable(model, encoder=False, merger=True, llm=True)
    renderer = SampleRenderer(cfg, exact._metas(name), seed=SEED, device=env.device)
    optim = optim or OptimConfig(max_grad_norm=MAX_GRAD_NORM)
    return PipelineTrainer(
        layout=plan.layout, model=model, env=env, renderer=renderer, optim=optim, autocast_dtype=autocast
    )


def _plan(name: str):
    k = 8 if "text-only" in name else 4
    return plan_for("dip", 1, 1, 1, k, works(list(exact._metas(name).values())))


def _exact(env, name: str) -> tuple:
    plan = _plan(name)
    trainer = _trainer(env, name, plan)
    val_loss = trainer.evaluate(plan.iterations[0])
    result, before = train_step_before_clip(trainer, plan.iterations[0])
    return before, trainer.named_grads(), result.loss, result.grad_norm, val_loss


def _bf16_gradients(env) -> tuple[dict, dict]:
    """(fp32, bf16 autocast) gradients before clipping of one step from the same weights."""
    plan = _plan("dip-1+1")
    grads = []
    for autocast in (None, torch.bfloat16):
        trainer = _trainer(env, "dip-1+1", plan, autocast=autocast)
        grads.append(train_step_before_clip(trainer, plan.iterations[0])[1])
    return grads[0], grads[1]


def _bf16_losses(env) -> list[float]:
    """Losses of ``BF16_STEPS`` bf16 autocast steps on one batch."""
    plan = _plan("dip-1+1")
    optim = OptimConfig(lr=3e-3, warmup_steps=1, total_steps=BF16_STEPS, max_grad_norm=1.0)
    trainer = _trainer(env, "dip-1+1", plan, autocast=torch.bfloat16, optim=optim)
    return [trainer.train_step(plan.iterations[0]).loss for _ in range(BF16_STEPS)]


def _one_gpu(env) -> dict:
    scenarios = {name: (lambda n=name: _exact(env, n)) for name in EXACT_CASES}
    scenarios["bf16-gradients"] = lambda: _bf16_gradients(env)
    scenarios["bf16-losses"] = lambda: _bf16_losses(env)
    return {"device": str(env.device), **each_scenario(scenarios)}


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory):
    [result] = run_spawned(_one_gpu, 1, tmp_path_factory.mktemp("one-gpu"))
    return result


def test_worker_ran_on_cuda(one_gpu):
    assert one_gpu["device"].startswith("cuda"), one_gpu["device"]


@pytest.mark.parametrize("name", EXACT_CASES)
def test_cuda_fp32_gradients_match_the_cpu_float64_reference(one_gpu, references, name):
    before, after, loss, grad_norm, val_loss = scenario(one_gpu, name)
    ref = references[exact._reference_kind(name)]
    assert ref.grad_norm > MAX_GRAD_NORM, f"{name}: clipping would not be exercised"
    assert_matches_reference(
        name, before=before, after=after, loss=loss, grad_norm=grad_norm, ref=ref, tol=TOL_FP32
    )
    assert abs(val_loss - ref.loss) < 1e-5 * abs(ref.loss), f"{name}: validation loss {val_loss}"


def global_relative_error(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """``|g - ref| / |ref|`` over all tensors together (one vector); a missing tensor counts whole."""
    assert grads.keys() == ref.keys(), sorted(set(grads) ^ set(ref))
    diff = math.fsum(float((grads[n].double() - r.double()).pow(2).sum()) for n, r in ref.items())
    norm = math.fsum(float(r.double().pow(2).sum()) for r in ref.values())
    return math.sqrt(diff / max(norm, 1e-300))


def test_bf16_gradients_are_fp32_ones_within_bf16_rounding(one_gpu):
    fp32, bf16 = scenario(one_gpu, "bf16-gradients")
    error = global_relative_error(bf16, fp32)
    assert 0 < error < TOL_BF16, f"bf16 vs fp32 gradients: relative error {error:.3g}"
    worst = max(relative_errors(bf16, fp32).values())
    assert worst < 10 * TOL_BF16, f"a bf16 gradient tensor is off by {worst:.3g} (relative)"


def test_bf16_training_loss_is_finite_and_falls(one_gpu):
    losses = scenario(one_gpu, "bf16-losses")
    assert all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0], f"bf16 loss did not fall over {BF16_STEPS} steps on one batch: {losses}"
