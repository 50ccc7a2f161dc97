"""Real-size models on one GPU: the ``qwen25vl-llama3-1b`` and ``-3b``
presets, one layer per kind (what ``entrain profile`` times, random weights), run a real sample
(one 448 x 448 image, 300 text tokens) through the encoder and LLM stages under bf16 autocast on
CUDA: the layers compute in bf16, the loss is finite and within bf16 rounding of the fp32 loss, and
every trainable parameter gets a finite gradient. Runs in a spawned worker (``gpu_harness``)."""

from __future__ import annotations

import math

import pytest
import torch
from runtime.gpu_harness import each_scenario, run_spawned, scenario

from entrain.core.workload.samples import SampleMeta
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_stage
from entrain.runtime.data import SampleRenderer
from entrain.runtime.profiler import representative_config, timing_model

pytestmark = pytest.mark.gpu

PRESETS = ("qwen25vl-llama3-1b", "qwen25vl-llama3-3b")
SAMPLE = SampleMeta("real", ((448, 448),), 300)


def _loss(model, renderer, device, autocast: bool) -> tuple[torch.Tensor, torch.dtype]:
    """(loss, dtype of the encoder's output) of the sample through every layer of ``model``."""
    cfg = model.cfg
    enc = build_stage(model, "encoder", 0, len(cfg.layer_names("encoder")))
    llm = build_stage(model, "llm", 0, len(cfg.layer_names("llm")))
    inputs = renderer.encoder_input([SAMPLE.id])
    batch = renderer.llm_batch([SAMPLE.id], 1.0 / renderer.num_labels([SAMPLE.id]))
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        features = enc(inputs.patches, inputs.grid_thw)
        loss = llm(features, batch)
    return loss, features.dtype


def _preset(env, name: str) -> dict:
    small, _ = representative_config(get_model_config(name))
    model = timing_model(small).to(env.device)
    renderer = SampleRenderer(small, {SAMPLE.id: SAMPLE}, device=env.device)
    fp32, _ = _loss(model, renderer, env.device, autocast=False)
    loss, dtype = _loss(model, renderer, env.device, autocast=True)
    model.zero_grad(set_to_none=True)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    return {
        "fp32_loss": float(fp32.detach()),
        "bf16_loss": float(loss.detach()),
        "features_dtype": str(dtype),
        "missing_grads": sorted(n for n, g in grads.items() if g is None),
        "nonfinite_grads": sorted(n for n, g in grads.items() if g is not None and not g.isfinite().all()),
    }


def _presets(env) -> dict:
    return {"device": str(env.device), **each_scenario({n: (lambda n=n: _preset(env, n)) for n in PRESETS})}


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    [result] = run_spawned(_presets, 1, tmp_path_factory.mktemp("real-size"), timeout_s=300)
    assert result["device"].startswith("cuda"), result["device"]
    return result


@pytest.mark.parametrize("name", PRESETS)
def test_real_size_layers_train_in_bf16_on_cuda(presets, name):
    out = scenario(presets, name)
    assert out["features_dtype"] == "torch.bfloat16", out
    assert math.isfinite(out["bf16_loss"]) and math.isfinite(out["fp32_loss"]), out
    assert abs(out["bf16_loss"] - out["fp32_loss"]) < 0.02 * abs(out["fp32_loss"]), out
    assert not out["missing_grads"] and not out["nonfinite_grads"], out
