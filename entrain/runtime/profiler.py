"""Measure per-layer forward / backward times of a model preset and fit ``T(x) = a x^2 + b x + c``.

Every layer of the cost model's lists (encoder: patch_embed, blocks, merger; LLM: embed_tokens,
decoder layers, norm, lm_head, loss) runs alone as a one-layer stage on one sequence unit of ``x``
tokens (an image of ``x`` ViT patches; a sample of ``x`` LLM tokens with ``LABEL_FRACTION`` of them
labelled; for the layers that run only at label positions, ``LayerCost.per_label``: ``x`` labelled
tokens, so their curves are per label token). Each (layer, size): ``warmup`` untimed runs, then the
median of ``repeats`` timed runs taken in rounds over all of them (``_measure_rounds``); thread-CPU
time on the CPU (one thread), CUDA events around the forward and the backward on a GPU. In the
``precision`` training computes in: bf16 runs each forward under ``torch.autocast`` over fp32 weights
(its backward follows the forward's dtypes), as ``entrain train --precision bf16`` does.

Representative layers: layers of one ``kind`` (``vit_block_window``, ``vit_block_full``,
``decoder_layer``, ...) have identical shapes, so by default ONE layer per kind is measured, in a
model built with one block per kind (the paper-size presets do not fit in this CPU's time or memory
otherwise: a 1B decoder layer at 4,096 tokens takes seconds per pass), and its costs are replicated
onto every layer of that kind. ``all_layers=True`` measures every layer of the full model instead.

Fit: least squares with a non-negativity constraint on ``a, b, c`` (``scipy.optimize.nnls``; two
sizes fit ``b, c`` only). Fit quality per layer and phase: R^2 and the worst relative residual
``max |fit - measured| / measured``. Where that residual exceeds ``MAX_REL_RESIDUAL`` the layer also
gets a monotone piecewise-linear ``table`` (isotonic regression of the medians,
``scipy.optimize.isotonic_regression``) which ``CostModel.layer_ms`` uses instead of the quadratic.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.optimize import isotonic_regression, nnls
from torch import nn

from entrain.core.costs.costmodel import (
    PROFILE_SOURCE,
    ComponentCost,
    CostModel,
    Quadratic,
    parallel_key,
)
from entrain.core.model.architectures import PRECISIONS
from entrain.models.families.registry import build_stage, family_of

__all__ = [
    "MAX_REL_RESIDUAL",
    "FitQuality",
    "LayerFit",
    "fit_quadratic",
    "fit_curve",
    "fit_quality",
    "representative_config",
    "profile_model",
]

KEY = parallel_key(1, 1)
MAX_REL_RESIDUAL = 0.2
"""Worst relative residual of the quadratic above which a layer gets a piecewise-linear table."""


@dataclass(frozen=True, slots=True)
class FitQuality:
    r2: float
    """Coefficient of determination (1.0 when the measurements are all equal and matched)."""
    worst_rel_residual: float
    """``max |fit(x) - ms| / ms`` over the measured sizes."""


@dataclass(frozen=True, slots=True)
class LayerFit:
    """Measurements and fit of one layer and phase (what ``entrain profile`` prints)."""

    component: str
    layer: str
    kind: str
    phase: str
    xs: tuple[int, ...]
    ms: tuple[float, ...]
    quadratic: FitQuality
    """Quality of the quadratic alone."""
    table: bool
    """True when the quadratic's worst residual exceeded ``MAX_REL_RESIDUAL`` and a table is used."""
    used: FitQuality
    """Quality of the curve the profile uses (the table where there is one)."""

    def to_json(self) -> dict:
        return {
            "component": self.component,
            "layer": self.layer,
            "kind": self.kind,
            "phase": self.phase,
            "tokens": list(self.xs),
            "ms": list(self.ms),
            "r2": self.quadratic.r2,
            "worst_rel_residual": self.quadratic.worst_rel_residual,
            "table": self.table,
            "used_r2": self.used.r2,
            "used_worst_rel_residual": self.used.worst_rel_residual,
        }


# --- fitting -----------------------------------------------------------------------------------------
def fit_quadratic(xs: Sequence[float], ms: Sequence[float]) -> Quadratic:
    """Non-negative least-squares ``a, b, c`` of ``ms ~ a x^2 + b x + c`` (``b, c`` only for fewer
    than three distinct sizes)."""
    x = np.asarray(xs, dtype=float)
    scale = max(float(x.max()), 1.0)
    cols = [(x / scale) ** 2, x / scale, np.ones_like(x)]
    if len(set(xs)) < 3:
        cols = cols[1:]
    coef, _ = nnls(np.stack(cols, axis=1), np.asarray(ms, dtype=float))
    if len(coef) == 2:
        coef = np.concatenate([[0.0], coef])
    return Quadratic(float(coef[0] / scale**2), float(coef[1] / scale), float(coef[2]))


def fit_quality(curve: Callable[[float], float], xs: Sequence[float], ms: Sequence[float]) -> FitQuality:
    pred = np.array([curve(x) for x in xs])
    y = np.asarray(ms, dtype=float)
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    rel = np.abs(pred - y) / np.maximum(y, 1e-9)
    return FitQuality(r2, float(rel.max()) if len(rel) else 0.0)


def monotone_table(xs: Sequence[float], ms: Sequence[float]) -> tuple[tuple[float, float], ...]:
    """``(x, ms)`` points, ``x`` increasing (duplicate sizes averaged), ``ms`` the isotonic (non-
    decreasing) fit of the measurements, least squares in relative terms (weights ``1 / ms^2``)."""
    by_x: dict[float, list[float]] = {}
    for x, y in zip(xs, ms):
        by_x.setdefault(float(x), []).append(float(y))
    ux = sorted(by_x)
    y = [statistics.fmean(by_x[x]) for x in ux]
    w = [len(by_x[x]) / max(v, 1e-9) ** 2 for x, v in zip(ux, y)]
    iso = isotonic_regression(y, weights=w, increasing=True).x
    return tuple((x, max(0.0, float(v))) for x, v in zip(ux, iso))


def fit_curve(xs: Sequence[float], ms: Sequence[float]) -> tuple[Quadratic, FitQuality, FitQuality]:
    """(curve, quality of the quadratic, quality of the curve): the NNLS quadratic, or it plus a
    monotone table when the quadratic's worst relative residual exceeds ``MAX_REL_RESIDUAL`` and the
    table's is smaller."""
    q = fit_quadratic(xs, ms)
    quality = fit_quality(q, xs, ms)
    if quality.worst_rel_residual <= MAX_REL_RESIDUAL:
        return q, quality, quality
    curve = replace(q, table=monotone_table(xs, ms))
    used = fit_quality(curve, xs, ms)
    if used.worst_rel_residual >= quality.worst_rel_residual:
        return q, quality, quality
    return curve, quality, used


# --- inputs --------------------------------------------------------------------------------------------
def representative_config(cfg) -> tuple[object, dict[str, dict[int, int]]]:
    """The model family's reduced model (one layer per kind) and per component the map from each layer
    of ``cfg``'s lists to the small model's layer measured for it (``ModelFamily.representative_config``)."""
    return family_of(cfg).representative_config(cfg)


def _encoder_input(model: nn.Module, layer: int, x: int, device: torch.device, per_label: bool = False):
    return family_of(model.cfg).profile_input(model.cfg, "encoder", layer, x, device, per_label)


def _llm_input(model: nn.Module, layer: int, x: int, device: torch.device, per_label: bool = False):
    return family_of(model.cfg).profile_input(model.cfg, "llm", layer, x, device, per_label)


def timing_model(cfg, seed: int = 0) -> nn.Module:
    """The model with cheap uniform(-0.02, 0.02) weights instead of the Hugging Face initialisers
    (3x faster for the paper-size vocabularies; times do not depend on the values). A checkpoint
    model's modules (built on the meta device, ``ModelFamily.empty_model``) get CPU storage here and
    never read its checkpoint."""
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = family_of(cfg).empty_model(cfg)
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if p.is_meta:
                setattr(module, name, nn.Parameter(torch.empty(p.shape, dtype=p.dtype), p.requires_grad))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.02, 0.02, generator=gen)
    return model


# --- timing --------------------------------------------------------------------------------------------
def precision_context(precision: str, device: torch.device) -> Callable[[], AbstractContextManager]:
    """What a forward runs under in ``precision``: bf16 autocast on ``device``, or nothing (fp32)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: choose from {', '.join(PRECISIONS)}")
    if precision == "bf16":
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext


def _backward(out) -> None:
    """The backward of a stage's output: a tensor, or a stage's message parts (``dict``: every part
    that needs a gradient gets ones, as the next stage's gradients would arrive)."""
    outs = [t for t in out.values() if t is not None and t.requires_grad] if isinstance(out, dict) else [out]
    torch.autograd.backward(outs, [torch.ones_like(t) if t.dim() else None for t in outs])


def _time_once(run_fwd: Callable[[], torch.Tensor], device: torch.device) -> tuple[float, float]:
    """(forward ms, backward ms) of one pass: thread-CPU time on the CPU, CUDA events on a GPU."""
    if device.type == "cuda":
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        ev[0].record()
        out = run_fwd()
        ev[1].record()
        _backward(out)
        ev[2].record()
        torch.cuda.synchronize()
        return ev[0].elapsed_time(ev[1]), ev[1].elapsed_time(ev[2])
    t0 = time.thread_time()
    out = run_fwd()
    t1 = time.thread_time()
    _backward(out)
    t2 = time.thread_time()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3


@dataclass(frozen=True)
class _Entry:
    """One (layer, size) to time."""

    comp: str
    layer: int
    x: int
    per_label: bool


def _measure_rounds(
    model: nn.Module,
    entries: Sequence[_Entry],
    device: torch.device,
    repeats: int,
    warmup: int,
    budget_s: float = math.inf,
    precision: str = "fp32",
) -> dict[_Entry, tuple[int, float, float]]:
    """Per entry (units, median forward ms, median backward ms), timed in interleaved rounds: every
    entry runs ``warmup`` untimed passes, then each round times one pass of every entry still
    measuring, up to ``repeats`` rounds; an entry stops after at least one timed pass once its
    passes have taken ``budget_s`` wall seconds (slow layers of big models do not take minutes).
    Rounds rather than back-to-back repeats spread each entry's samples over the whole profile, so a
    transient slow or fast spell of the machine moves every entry alike instead of a few. (Profiles
    of separate processes still differ per layer: ``median_profile``.) Inputs are made per pass, so
    only one entry's input is alive at a time. Forwards run in ``precision`` (``precision_context``)."""
    stages: dict[tuple[str, int], nn.Module] = {}
    compute = precision_context(precision, device)

    def once(e: _Entry) -> tuple[int, tuple[float, float], float]:
        stage = stages.get((e.comp, e.layer))
        if stage is None:
            stage = stages[(e.comp, e.layer)] = build_stage(model, e.comp, e.layer, e.layer + 1)
        make = _encoder_input if e.comp == "encoder" else _llm_input
        args, units = make(model, e.layer, e.x, device, e.per_label)

        def forward() -> torch.Tensor:
            with compute():
                return stage(*args)

        start = time.perf_counter()
        times = _time_once(forward, device)
        wall_s = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return units, times, wall_s

    for e in entries:
        for _ in range(warmup):
            once(e)
    samples: dict[_Entry, list[tuple[float, float]]] = {e: [] for e in entries}
    units: dict[_Entry, int] = {}
    spent_s = dict.fromkeys(entries, 0.0)
    for _ in range(repeats):
        for e in entries:
            if samples[e] and spent_s[e] >= budget_s:
                continue
            units[e], times, wall_s = once(e)
            spent_s[e] += wall_s
            samples[e].append(times)
    return {
        e: (units[e], statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts))
        for e, ts in samples.items()
    }


# --- the profile ---------------------------------------------------------------------------------------
def profile_model(
    cfg,
    analytic: CostModel,
    *,
    tokens: Sequence[int],
    device: torch.device,
    repeats: int = 5,
    warmup: int = 1,
    budget_s: float = 1.0,
    all_layers: bool = False,
    seed: int = 0,
    hardware_name: str | None = None,
    progress: Callable[[LayerFit], None] | None = None,
    precision: str = "fp32",
) -> tuple[CostModel, list[LayerFit]]:
    """Measured per-layer costs in ``analytic``'s schema (its other layer fields are kept), and the
    fit of every measured layer and phase. ``all_layers``: measure every layer of the full model;
    else one representative per layer kind (``representative_config``). ``budget_s``: wall seconds
    after which the timed passes of one layer and size stop (at least one runs). ``precision``: the
    compute precision of ``entrain train --precision`` the layers are timed in (recorded in the notes)."""
    small, rep = _representatives(cfg, all_layers)
    model = timing_model(small, seed).to(device)
    bases = {
        (comp, i): analytic.component(comp).layers[min(k for k, v in rep[comp].items() if v == i)]
        for comp in ("encoder", "llm")
        for i in sorted(set(rep[comp].values()))
    }
    entries = [_Entry(comp, i, x, base.per_label) for (comp, i), base in bases.items() for x in tokens]
    timed = _measure_rounds(model, entries, device, repeats, warmup, budget_s, precision)
    fits: list[LayerFit] = []
    comps = {
        comp: _fitted_component(comp, analytic, rep[comp], bases, timed, tokens, fits, progress)
        for comp in ("encoder", "llm")
    }
    expert_fit = None
    if analytic.has_experts("llm"):  # the experts' time per routed slot (ExpertCost.measured)
        from entrain.runtime.profile_experts import measure_model_experts

        def time_pass(run):
            return _time_once(run, device)

        comps["llm"], expert_fit = measure_model_experts(
            model,
            comps["llm"],
            tokens,
            device,
            time_pass,
            precision_context(precision, device),
            repeats,
            warmup,
        )
    notes = {
        "source": PROFILE_SOURCE,
        "device": str(device),
        "precision": precision,
        "tokens": list(tokens),
        "repeats": repeats,
        "warmup": warmup,
        "budget_s_per_size": budget_s,
        "clock": "cuda events" if device.type == "cuda" else "thread_time (1 thread)",
        "fit": f"NNLS a,b,c >= 0; monotone table where worst relative residual > {MAX_REL_RESIDUAL:.0%}",
        "layers": "all measured" if all_layers else "one representative per kind, replicated",
        "representatives": {
            c: {base_layers_name: small.layer_names(c)[i] for base_layers_name, i in _named(cfg, c, rep[c])}
            for c in ("encoder", "llm")
        },
        "fits": [f.to_json() for f in fits],
        **({"experts": expert_fit.to_json()} if expert_fit is not None else {}),
        "torch": torch.__version__,
    }
    cost = CostModel(
        model=cfg.name,
        hardware=replace(analytic.hardware, name=hardware_name or f"profile-{device.type}"),
        encoder=comps["encoder"],
        llm=comps["llm"],
        notes=notes,
    )
    return cost, fits


def _representatives(cfg, all_layers: bool) -> tuple[object, dict[str, dict[int, int]]]:
    """The model to time and, per component, each layer's representative in it: the full model and
    every layer itself with ``all_layers``, else ``representative_config``."""
    if all_layers:
        return cfg, {c: {i: i for i in range(len(cfg.layer_names(c)))} for c in ("encoder", "llm")}
    return representative_config(cfg)


def _fitted_component(
    comp: str,
    analytic: CostModel,
    rep: dict[int, int],
    bases: dict,
    timed: dict,
    tokens: Sequence[int],
    fits: list[LayerFit],
    progress: Callable[[LayerFit], None] | None,
) -> ComponentCost:
    """``comp``'s layers with the fitted curves of their representatives (``analytic``'s other fields
    kept); every fit is appended to ``fits`` and shown to ``progress``."""
    measured: dict[int, tuple[Quadratic, Quadratic]] = {}
    for i in sorted(set(rep.values())):
        base = bases[(comp, i)]
        rows = [timed[_Entry(comp, i, x, base.per_label)] for x in tokens]
        xs, fwd, bwd = ([r[k] for r in rows] for k in range(3))
        curves = []
        for phase, ms in (("fwd", fwd), ("bwd", bwd)):
            curve, q_quality, used = fit_curve(xs, ms)
            curves.append(curve)
            fit = LayerFit(
                comp, base.name, base.kind, phase, tuple(xs), tuple(ms), q_quality, bool(curve.table), used
            )
            fits.append(fit)
            if progress:
                progress(fit)
        measured[i] = (curves[0], curves[1])
    layers = [
        replace(base, fwd={KEY: measured[rep[k]][0]}, bwd={KEY: measured[rep[k]][1]})
        for k, base in enumerate(analytic.component(comp).layers)
    ]
    return ComponentCost(comp, tuple(layers))


def _named(cfg, comp: str, rep: dict[int, int]) -> list[tuple[str, int]]:
    names = cfg.layer_names(comp)
    return [(names[k], v) for k, v in sorted(rep.items())]


def median_profile(profiles: Sequence[CostModel]) -> tuple[CostModel, list[LayerFit]]:
    """One profile from several independent ``profile_model`` runs of the same model and sizes: per
    layer, phase and size the median of their measurements, fitted again (``fit_curve``).

    A profile process is one draw of per-layer speeds: two profiles of one idle CPU, a minute apart,
    differed by 20-30 % on single layers, uniformly over sizes (one layer slower, another faster), so
    a simulator fed one profile errs by that much on the stages those layers make up. The median of
    a few processes (different ``seed``s) is the better estimate of what a training process sees.
    A mixture-of-experts model's sparse block timing (``notes["experts"]``, every sparse layer's
    ``experts.measured``) is merged the same way (``profile_experts.median_expert_fit``)."""
    first = profiles[0]
    if any(p.model != first.model or "fits" not in p.notes for p in profiles):
        raise ValueError("median_profile needs `entrain profile` outputs of one model")
    if len({p.measured_precision() for p in profiles}) > 1:
        raise ValueError("median_profile needs profiles measured in one precision")
    by_key = [{(f["component"], f["layer"], f["phase"]): f for f in p.notes["fits"]} for p in profiles]
    fits: list[LayerFit] = []
    curves: dict[tuple[str, str, str], Quadratic] = {}
    for key, f in by_key[0].items():
        xs = tuple(f["tokens"])
        if any(k[key]["tokens"] != list(xs) for k in by_key[1:]):
            raise ValueError(f"median_profile: {key} was measured at other sizes in another profile")
        ms = tuple(float(np.median([k[key]["ms"][i] for k in by_key])) for i in range(len(xs)))
        curve, q_quality, used = fit_curve(xs, ms)
        curves[key] = curve
        fits.append(LayerFit(*key[:2], f["kind"], key[2], xs, ms, q_quality, bool(curve.table), used))
    comps = {}
    for comp in ("encoder", "llm"):
        reps = first.notes["representatives"][comp]
        measured_as = {}  # representative -> the first layer measured for it (the fit's name)
        for name in first.component(comp).layer_names:
            measured_as.setdefault(reps[name], name)
        layers = tuple(
            replace(layer, fwd={KEY: curves[(comp, measured_as[reps[layer.name]], "fwd")]},
                    bwd={KEY: curves[(comp, measured_as[reps[layer.name]], "bwd")]})
            for layer in first.component(comp).layers
        )  # fmt: skip
        comps[comp] = ComponentCost(comp, layers)
    notes = {**first.notes, "fits": [f.to_json() for f in fits], "median_of": len(profiles)}
    experts = [p.notes.get("experts") for p in profiles]
    if any(experts):  # the sparse block's timing: the median of every profile's, not the first's
        from entrain.runtime.profile_experts import median_expert_fit, with_expert_timing

        if not all(experts):
            raise ValueError("median_profile: some profiles timed the experts and others did not")
        expert_fit = median_expert_fit(experts)
        comps["llm"] = with_expert_timing(comps["llm"], expert_fit.timing)
        notes["experts"] = expert_fit.to_json()
    return replace(first, encoder=comps["encoder"], llm=comps["llm"], notes=notes), fits
