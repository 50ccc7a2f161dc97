"""Measure per-layer forward / backward times of a model preset and fit ``T(x) = a x^2 + b x + c``.

Every layer of the cost model's lists (encoder: patch_embed, blocks, merger; LLM: embed_tokens,
decoder layers, norm, lm_head, loss) runs alone as a one-layer stage on one sequence unit of ``x``
tokens (an image of ``x`` ViT patches; a sample of ``x`` LLM tokens with ``LABEL_FRACTION`` of them
labelled). Each size: one warm-up, then the median of ``repeats`` runs; thread-CPU time on the CPU
(one thread), wall time after ``synchronize`` on CUDA. The fit is non-negative least squares
(``scipy.optimize.nnls``). The result has the analytic preset's schema: its layers with the measured
``tp1cp1`` forward / backward quadratics.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch
from scipy.optimize import nnls

from entrain.core.costmodel import ComponentCost, CostModel, Quadratic, parallel_key
from entrain.core.presets import LABEL_FRACTION
from entrain.models.config import VLMConfig
from entrain.models.vlm import VLM, LLMBatch, build_stage

__all__ = ["profile_model", "fit_quadratic", "image_grid"]

KEY = parallel_key(1, 1)


def fit_quadratic(xs: Sequence[float], ms: Sequence[float]) -> Quadratic:
    """Non-negative least-squares ``a, b, c`` of ``ms ~ a x^2 + b x + c``."""
    x = np.asarray(xs, dtype=float)
    scale = max(float(x.max()), 1.0)
    design = np.stack([(x / scale) ** 2, x / scale, np.ones_like(x)], axis=1)
    coef, _ = nnls(design, np.asarray(ms, dtype=float))
    return Quadratic(float(coef[0] / scale**2), float(coef[1] / scale), float(coef[2]))


def image_grid(num_patches: int, merge: int = 2) -> tuple[int, int, int]:
    """A still image ``(1, h, w)`` of about ``num_patches`` patches, ``h`` and ``w`` multiples of ``merge``."""
    side = max(merge, int(round(math.sqrt(num_patches) / merge)) * merge)
    w = max(merge, int(round(num_patches / side / merge)) * merge)
    return (1, side, w)


class _Clock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return time.perf_counter()
        return time.thread_time()


def _measure(run_fwd: Callable[[], torch.Tensor], clock: _Clock, repeats: int) -> tuple[float, float]:
    """(median forward ms, median backward ms) after one warm-up."""
    fwd, bwd = [], []
    for i in range(repeats + 1):
        t0 = clock.now()
        out = run_fwd()
        t1 = clock.now()
        grad = torch.ones_like(out) if out.dim() else None
        torch.autograd.backward(out, grad)
        t2 = clock.now()
        if i:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
    return statistics.median(fwd), statistics.median(bwd)


def _encoder_runner(model: VLM, layer: int, x: int, device: torch.device) -> Callable[[], torch.Tensor]:
    cfg = model.cfg
    stage = build_stage(model, "encoder", layer, layer + 1)
    grid_t = image_grid(x, cfg.vision.spatial_merge_size)
    grid = torch.tensor([grid_t], dtype=torch.int64, device=device)
    n = grid_t[1] * grid_t[2]
    width = cfg.vision.patch_dim if layer == 0 else cfg.vision.hidden_size
    inp = torch.randn((n, width), device=device, requires_grad=layer > 0)
    return lambda: stage(inp, grid)


def _llm_runner(model: VLM, layer: int, x: int, device: torch.device) -> Callable[[], torch.Tensor]:
    cfg = model.cfg
    names = cfg.llm_layer_names
    stage = build_stage(model, "llm", layer, layer + 1)
    num_labels = max(1, round(LABEL_FRACTION * x))
    ids = torch.randint(0, cfg.llm.vocab_size, (x,), device=device)
    label_pos = torch.arange(x - num_labels, x, device=device)
    batch = LLMBatch(
        input_ids=ids,
        position_ids=torch.arange(x, device=device),
        seq_lens=(x,),
        image_positions=torch.zeros(0, dtype=torch.int64, device=device),
        label_positions=label_pos,
        targets=ids[label_pos],
        loss_scale=1.0 / num_labels,
    )
    name = names[layer]
    h = cfg.llm.hidden_size
    if name == "embed_tokens":
        inp = None
    elif name == "loss":
        inp = torch.randn((num_labels, cfg.llm.vocab_size), device=device, requires_grad=True)
    else:
        inp = torch.randn((1, x, h), device=device, requires_grad=True)
    return lambda: stage(inp, batch)


def profile_model(
    model: VLM,
    cfg: VLMConfig,
    analytic: CostModel,
    *,
    tokens: Sequence[int],
    device: torch.device,
    repeats: int = 5,
    hardware_name: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> CostModel:
    """Measured per-layer costs in ``analytic``'s schema (its other layer fields are kept)."""
    clock = _Clock(device)
    comps = {}
    for comp, runner in (("encoder", _encoder_runner), ("llm", _llm_runner)):
        layers = []
        for i, base in enumerate(analytic.component(comp).layers):
            fwd_ms, bwd_ms, xs = [], [], []
            for x in tokens:
                run = runner(model, i, x, device)
                f, b = _measure(run, clock, repeats)
                xs.append(image_grid(x)[1] * image_grid(x)[2] if comp == "encoder" else x)
                fwd_ms.append(f)
                bwd_ms.append(b)
            model.zero_grad(set_to_none=True)
            layers.append(
                replace(base, fwd={KEY: fit_quadratic(xs, fwd_ms)}, bwd={KEY: fit_quadratic(xs, bwd_ms)})
            )
            if progress:
                progress(f"{comp}/{base.name}: fwd {fwd_ms} bwd {bwd_ms} ms at {xs}")
        comps[comp] = ComponentCost(comp, tuple(layers))
    name = hardware_name or f"profile-{device.type}"
    notes = {
        "source": "entrain profile",
        "device": str(device),
        "tokens": list(tokens),
        "repeats": repeats,
        "clock": "cuda synchronize + perf_counter" if device.type == "cuda" else "thread_time (1 thread)",
        "torch": torch.__version__,
    }
    return CostModel(
        model=cfg.name,
        hardware=replace(analytic.hardware, name=name),
        encoder=comps["encoder"],
        llm=comps["llm"],
        notes=notes,
    )
