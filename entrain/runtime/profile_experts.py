"""``entrain profile`` of a mixture-of-experts model: time its sparse block's router and experts as a
function of tokens and per-expert load, and fit the numbers ``ExpertCost.measured`` carries.

The block is the reduced profiling model's own (transformers' ``Qwen3VLMoeTextSparseMoeBlock`` of the
checkpoint's config, random weights: ``entrain.runtime.profiler.timing_model``); its experts run as
the runtime runs them (the ``eager`` loop over the experts a token is routed to). Per size ``x`` of
``--tokens``: the router alone on ``[x, H]``, and the experts on ``[x, H]`` with two routes of the same
``x * top_k`` slots — ``balanced`` (round-robin over every expert) and ``concentrated`` (every token on
experts ``0..top_k-1``, the most one expert can get) — each forward + backward, ``warmup`` untimed and
the median of ``repeats`` timed passes (thread-CPU time on the CPU, CUDA events on a GPU). Per phase,
non-negative least squares over the expert measurements:

    ms = call_ms * (experts that get a token) + slot_ms * (routed slots) + c

(the two routes separate the per-expert call from the per-slot work), and ``ms = r * tokens + c`` for
the router. ``CostModel.expert_ms`` prices a rank's extra expert tokens at ``top_k * slot_ms``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.optimize import nnls
from torch import nn

from entrain.core.costs.costmodel import ComponentCost, ExpertTiming

__all__ = [
    "ExpertFit",
    "Timer",
    "sparse_block",
    "expert_routes",
    "measure_experts",
    "measure_model_experts",
    "median_expert_fit",
    "with_expert_timing",
]

ROUTES = ("balanced", "concentrated")

Timer = Callable[[Callable[[], object]], tuple[float, float]]
"""``time(run)``: (forward ms, backward ms) of one pass of ``run`` (a forward; its output's backward is
timed too) on the profile's device and clock (``entrain.runtime.profiler``)."""


@dataclass(frozen=True, slots=True)
class ExpertFit:
    """The measurements and fit of ``measure_experts`` (``--json``'s and the profile notes' ``experts``)."""

    timing: ExpertTiming
    rows: tuple[dict, ...]
    """Per measurement: ``part`` (router / experts), ``pattern`` (the route; None for the router),
    ``tokens``, ``slots``, ``experts_hit``, ``fwd_ms``, ``bwd_ms``."""

    def to_json(self) -> dict:
        return {**self.timing.to_json(), "measurements": list(self.rows)}


def sparse_block(model: nn.Module) -> nn.Module | None:
    """The model's first mixture-of-experts block: a module with a ``gate`` router (``top_k``,
    ``num_experts``, ``weight [E, H]``; called on ``[T, H]``, returning logits, weights and ``[T, k]``
    experts) and ``experts`` (called on hidden ``[T, H]``, the ``[T, k]`` experts and their weights), as
    transformers' Qwen3-VL-MoE ``...TextSparseMoeBlock``; None: a dense model."""
    for module in model.modules():
        gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
        if isinstance(gate, nn.Module) and isinstance(experts, nn.Module) and hasattr(gate, "top_k"):
            return module
    return None


def expert_routes(tokens: int, num_experts: int, top_k: int, pattern: str) -> torch.Tensor:
    """``[tokens, top_k]`` experts: ``balanced`` spreads the slots round-robin over every expert,
    ``concentrated`` sends every token to experts ``0..top_k-1``."""
    slot = torch.arange(tokens * top_k).view(tokens, top_k)
    if pattern == "balanced":
        return slot % num_experts
    if pattern == "concentrated":
        return slot % top_k
    raise ValueError(f"route {pattern!r}: choose from {', '.join(ROUTES)}")


def _runs(block: nn.Module, tokens: Sequence[int], device: torch.device, compute) -> list:
    """``(part, pattern, x, slots, experts hit, run)`` per measurement; ``run()`` is one forward under
    ``compute()`` (the precision's context)."""
    gate, experts = block.gate, block.experts
    k, e, width = int(gate.top_k), int(gate.num_experts), int(gate.weight.shape[-1])
    gen = torch.Generator().manual_seed(0)

    def hidden(x: int) -> torch.Tensor:
        return torch.randn((x, width), generator=gen).to(device).requires_grad_(True)

    def router(h: torch.Tensor):
        def run():
            with compute():
                logits, weights, _ = gate(h)
            return {"logits": logits, "weights": weights}

        return run

    def routed(h: torch.Tensor, idx: torch.Tensor, w: torch.Tensor):
        def run():
            with compute():
                return experts(h, idx, w)

        return run

    out = [("router", None, x, x * k, 0, router(hidden(x))) for x in tokens]
    for pattern in ROUTES:
        for x in tokens:
            idx = expert_routes(x, e, k, pattern).to(device)
            w = torch.full((x, k), 1.0 / k, device=device, requires_grad=True)
            hit = int(idx.unique().numel())
            out.append(("experts", pattern, x, x * k, hit, routed(hidden(x), idx, w)))
    return out


def measure_experts(
    block: nn.Module,
    tokens: Sequence[int],
    device: torch.device,
    time: Timer,
    compute: Callable[[], AbstractContextManager],
    repeats: int = 5,
    warmup: int = 1,
) -> ExpertFit:
    """Time ``block``'s router and experts at every size of ``tokens`` (the module docstring) with
    ``time``, forwards under ``compute()``, and fit ``ExpertTiming``."""
    rows = []
    for part, pattern, x, slots, hit, run in _runs(block, tokens, device, compute):
        for _ in range(warmup):
            time(run)
        times = [time(run) for _ in range(repeats)]
        block.zero_grad(set_to_none=True)
        rows.append({"part": part, "pattern": pattern, "tokens": x, "slots": slots, "experts_hit": hit,
                     "fwd_ms": statistics.median(t[0] for t in times),
                     "bwd_ms": statistics.median(t[1] for t in times)})  # fmt: skip
    return ExpertFit(fit_timing(rows), tuple(rows))


def fit_timing(rows: Sequence[dict]) -> ExpertTiming:
    """``ExpertTiming`` of ``measure_experts``' rows: per phase NNLS of the experts' ms on (experts hit,
    slots, 1) and of the router's ms on (tokens, 1); columns scaled by their largest value."""
    ex = [r for r in rows if r["part"] == "experts"]
    ro = [r for r in rows if r["part"] == "router"]
    hits = np.array([r["experts_hit"] for r in ex], dtype=float)
    slots = np.array([r["slots"] for r in ex], dtype=float)
    xs = np.array([r["tokens"] for r in ro], dtype=float)
    h, s, x = max(hits.max(), 1.0), slots.max(), xs.max()
    out = {}
    for phase in ("fwd", "bwd"):
        coef, _ = nnls(np.stack([hits / h, slots / s, np.ones_like(hits)], axis=1), _ms(ex, phase))
        router, _ = nnls(np.stack([xs / x, np.ones_like(xs)], axis=1), _ms(ro, phase))
        out[phase] = (float(coef[1] / s), float(coef[0] / h), float(router[0] / x))
    (fs, fc, fr), (bs, bc, br) = out["fwd"], out["bwd"]
    return ExpertTiming(fs, bs, fc, bc, fr, br)


def _ms(rows: Sequence[dict], phase: str) -> np.ndarray:
    return np.array([r[f"{phase}_ms"] for r in rows], dtype=float)


def measure_model_experts(
    model: nn.Module,
    llm: ComponentCost,
    tokens: Sequence[int],
    device: torch.device,
    time: Timer,
    compute: Callable[[], AbstractContextManager],
    repeats: int,
    warmup: int,
) -> tuple[ComponentCost, ExpertFit | None]:
    """``llm`` with every mixture-of-experts layer's ``ExpertCost.measured`` set from the timing of
    ``model``'s sparse block (all sparse layers of a checkpoint have one shape), and the fit; ``llm``
    itself and None when the model has no sparse block."""
    block = sparse_block(model)
    if block is None:
        return llm, None
    fit = measure_experts(block, tokens, device, time, compute, repeats, warmup)
    return with_expert_timing(llm, fit.timing), fit


def with_expert_timing(llm: ComponentCost, timing: ExpertTiming) -> ComponentCost:
    """``llm`` with every mixture-of-experts layer's ``ExpertCost.measured`` set to ``timing``."""
    layers = tuple(
        replace(x, experts=replace(x.experts, measured=timing)) if x.experts is not None else x
        for x in llm.layers
    )
    return ComponentCost(llm.name, layers)


def _row_key(row: dict) -> tuple:
    return (row["part"], row["pattern"], row["tokens"], row["slots"], row["experts_hit"])


def median_expert_fit(fits: Sequence[dict]) -> ExpertFit:
    """One ``ExpertFit`` from several profiles' ``experts`` notes (``ExpertFit.to_json``) of one block
    and sizes: per measurement (part, route, tokens) the median of their forward and backward ms,
    fitted again (``fit_timing``), as ``profiler.median_profile`` does for the layers. ValueError when
    a profile's measurements are missing or were made at other sizes or routes."""
    rows = []
    for n, fit in enumerate(fits):
        got = fit.get("measurements") if isinstance(fit, dict) else None
        if not got:
            raise ValueError(f"median_profile: profile {n + 1}'s experts has no measurements")
        rows.append({_row_key(r): r for r in got})
    keys = list(rows[0])
    for n, r in enumerate(rows[1:], start=2):
        if set(r) != set(keys):
            raise ValueError(
                f"median_profile: profile {n}'s experts were measured at other sizes or routes than profile 1's"
            )
    merged = tuple(
        {
            **rows[0][k],
            **{f"{p}_ms": statistics.median(float(r[k][f"{p}_ms"]) for r in rows) for p in ("fwd", "bwd")},
        }
        for k in keys
    )
    return ExpertFit(fit_timing(merged), merged)
