"""One cost model from several traced runs of one model whose Plans cut the components at other
layers (``entrain profile --from-trace RUN --also-trace RUN2``; a paired run's 1F1B and Entrain traces):
``joint_refit``, beside ``entrain.sim.trace_fit``'s one-run stage refit, whose trace reading it shares.
Documented in docs/profiling.md (``Refit from a trace``)."""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from dataclasses import replace

import numpy as np

from entrain.core.costs.costmodel import PROFILE_SOURCE, CostModel, LayerCost, Quadratic
from entrain.core.costs.presets import fitted_kind
from entrain.core.errors import ConfigError
from entrain.sim.trace_fit import (
    TracedRun,
    action_overhead_ms,
    input_fractions,
    rank_overheads,
    refitted_model,
    scaled_layer,
    traced_computes,
)

__all__ = ["FIT_GROUPS", "joint_refit"]

# --- several runs of other stage cuts: one fit (``--from-trace RUN --also-trace RUN2``) -------------------
FIT_GROUPS = ("cuts", "kinds")
"""How ``joint_refit`` groups layers: ``cuts``: the finest layer ranges every traced stage is a union
of; ``kinds``: the layers of one kind (``LayerCost.kind``, as ``presets.fitted_kind`` groups them),
wherever they sit, so any cut is priced from the kinds' scales."""

Groups = dict[str, dict[str, tuple[int, ...]]]
"""Per component: group name -> its layer indices."""


def _groups(runs: list[TracedRun], by: str) -> Groups:
    """Per component, the layer groups one scale is fitted for (``FIT_GROUPS``)."""
    out: Groups = {}
    for comp in ("encoder", "llm"):
        layers = runs[0].base.component(comp).layers
        if by == "kinds":
            named: dict[str, list[int]] = defaultdict(list)
            for i, layer in enumerate(layers):
                named[fitted_kind(layer.kind)].append(i)
            out[comp] = {k: tuple(v) for k, v in named.items()}
            continue
        cuts = {0, len(layers)}
        for run in runs:
            for spec in run.plan.layout.stages:
                if spec.component == comp:
                    cuts |= {spec.first_layer, spec.end_layer}
        edges = sorted(cuts)
        out[comp] = {f"[{a},{b})": tuple(range(a, b)) for a, b in zip(edges, edges[1:])}
    return out


def _group_ms(run: TracedRun, stage: int, group: tuple[int, ...], phase: str, ids) -> tuple[float, float]:
    """The base's time of layers ``group`` of ``stage`` over ``ids``: (variable part, per sample,
    recomputation included; one call's constants), as ``PlanCosts`` prices a stage."""
    spec = run.plan.layout.stages[stage]
    par = run.plan.layout.components[spec.component]
    base, comp = run.base, spec.component
    constant = sum(base.layer_ms(comp, i, (), phase, par.tp, par.cp, 1) for i in group)
    total = 0.0
    for sid in ids:
        meta = run.plan.samples[sid].meta
        units, labels = base.units(comp, meta), base.labels(comp, meta)
        for i in group:
            total += base.layer_ms(comp, i, units, phase, par.tp, par.cp, 0, labels)
            if phase != "fwd":
                total += base.recompute_ms(comp, i, units, spec.recompute, par.tp, par.cp, 0, labels)
    return total, constant


Traced = list[tuple[TracedRun, list[tuple[int, str, tuple[str, ...], int, float]]]]
"""Each run with its ``traced_computes``."""


def _split_fitted(traced: Traced) -> set[str]:
    """Components whose traced backwards include both kinds (``B``, and ``I`` + ``W``): only there can
    the split's own cost be told from the backward's."""
    kinds: dict[str, set[bool]] = defaultdict(set)
    for run, computes in traced:
        for stage, phase, _, num_actions, _ in computes:
            if phase == "bwd":
                kinds[run.plan.layout.stages[stage].component].add(num_actions > 1)
    return {c for c, k in kinds.items() if k == {False, True}}


def _joint_rows(traced: Traced, groups: Groups, split_fitted: set[str]):
    """One row per traced compute (``traced_computes``): the predicted ms of each group part it
    covers (``(component, phase, group, "var" | "const")``; a split backward also the split's columns
    ``(component, "split", "", "var" | "const")`` where ``split_fitted``), its compute actions, its
    measured ms."""
    rows = []
    for run, computes in traced:
        for stage, phase, ids, num_actions, ms in computes:
            spec = run.plan.layout.stages[stage]
            comp, split = spec.component, phase == "bwd" and num_actions > 1
            priced = "bwd_split" if split and comp not in split_fitted else phase
            covered: dict[tuple, float] = defaultdict(float)
            for name, layers in groups[comp].items():
                inside = tuple(i for i in layers if spec.first_layer <= i < spec.end_layer)
                if not inside:
                    continue
                var, const = _group_ms(run, stage, inside, priced, ids)
                covered[(comp, phase, name, "var")] += var
                covered[(comp, phase, name, "const")] += const
                if split and comp in split_fitted:
                    trainable = [i for i in inside if run.base.component(comp).layers[i].trainable]
                    covered[(comp, "split", "", "var")] += var
                    covered[(comp, "split", "", "const")] += len(trainable)
            rows.append((dict(covered), num_actions, ms))
    return rows


def joint_refit(runs: list[TracedRun], by: str = "kinds") -> CostModel:
    """One cost model from runs of one model whose Plans cut the components at other layers (a paired
    run's 1F1B and Entrain traces): per component, phase and layer group (``_groups``, ``by`` one of
    ``FIT_GROUPS``) a scale of the base's size-dependent part and one of its per-call constants; per
    component whose backwards ran both whole and split (``_split_fitted``) the split's own cost, a
    share of the base's backward and a constant per layer; and one per-action constant, by
    non-negative least squares over every traced compute (``measured = sum over the groups it covers
    of (v_g * variable_g + c_g * constant_g) [+ split terms] + k * actions``). A cut the runs saw is
    priced as they ran it (with ``cuts``, a cut inside a group by the base's split of it). The
    hardware's per-action overhead is the runs' mean gap overhead (``action_overhead_ms``) plus ``k``;
    a split backward's input share, per stage as in ``refit``. Layers no traced stage boundary separates
    share their range's refitted total in the base's proportions (``_split_by_prior``). The end-of-step
    phase: one fit over every run (``step_end_fit``: their layouts' parameter bytes can tell its
    per-byte part)."""
    if by not in FIT_GROUPS:
        raise ConfigError(f"fit groups {by!r}: choose from {', '.join(FIT_GROUPS)}")
    base = runs[0].base
    if any(r.base.to_json()["components"] != base.to_json()["components"] for r in runs[1:]):
        raise ConfigError("--also-trace: every run must have been planned with the same cost model")
    traced = [(run, traced_computes(run)) for run in runs]
    groups, split_fitted = _groups(runs, by), _split_fitted(traced)
    scales, per_action_ms = _solve(_joint_rows(traced, groups, split_fitted))
    layers = {c: list(base.component(c).layers) for c in ("encoder", "llm")}
    fitted: dict[tuple[str, str, int], float] = {}
    for (comp, phase, name, part), s_g in scales.items():
        if part == "const" or phase == "split":
            continue
        c_g = scales.get((comp, phase, name, "const"), 1.0)
        for i in groups[comp][name]:
            const = _layer_constant(base, comp, i, phase)
            layers[comp][i] = scaled_layer(layers[comp][i], phase, s_g, c_g * const)
            fitted[(comp, phase, i)] = s_g
    spans = _groups(runs, "cuts")
    fitted |= _split_by_prior(base, layers, spans, fitted)
    for (comp, phase, i), s_i in fitted.items():
        if phase == "bwd" and comp in split_fitted:
            extra = scales[(comp, "split", "", "var")] / s_i if s_i > 0 else 0.0
            split_ms = scales[(comp, "split", "", "const")]
            layers[comp][i] = replace(layers[comp][i], split_extra_fraction=extra, split_extra_ms=split_ms)
    for run in runs:
        for stage, fraction in input_fractions(run).items():
            spec = run.plan.layout.stages[stage]
            for i in range(spec.first_layer, spec.end_layer):
                layers[spec.component][i] = replace(layers[spec.component][i], bwd_input_fraction=fraction)
    gaps = statistics.fmean(action_overhead_ms(r, rank_overheads(r)) for r in runs)
    notes = _notes(runs, by, groups, spans, scales, per_action_ms, gaps)
    return refitted_model(runs[0], layers, gaps + per_action_ms, notes, runs)


def _solve(rows) -> tuple[dict, float]:
    """The non-negative least-squares fit of ``_joint_rows``: each column's scale and the per-action
    constant (columns normalised to their largest entry, so their scales do not steer the solver)."""
    from scipy.optimize import nnls

    columns = sorted({c for covered, _, _ in rows for c in covered})
    index = {c: i for i, c in enumerate(columns)}
    a = np.zeros((len(rows), len(columns) + 1))
    y = np.array([ms for _, _, ms in rows])
    for r, (covered, num_actions, _) in enumerate(rows):
        for c, ms in covered.items():
            a[r, index[c]] = ms
        a[r, -1] = num_actions
    norm = np.maximum(np.abs(a).max(axis=0), 1e-12)
    solution = nnls(a / norm, y)[0] / norm
    return {c: float(solution[index[c]]) for c in columns}, float(solution[-1])


def _notes(
    runs, by: str, groups: Groups, spans: Groups, scales: dict, per_action_ms: float, gaps: float
) -> dict:
    """The refitted profile's ``notes``: its runs, the fit's groups and scales, the constants and the
    ranges split by the base."""
    base = runs[0].base
    return {
        "source": PROFILE_SOURCE,
        "from_trace": [os.path.abspath(r.folder) for r in runs],
        "base": base.notes.get("source", base.hardware.name),
        "device": runs[0].config.get("device"),
        "fit_groups": by,
        "group_scales": [
            {
                "component": c,
                "phase": p,
                "layers": list(groups[c][g]) if g else [],
                "group": g,
                "part": part,
                "scale": v,
            }
            for (c, p, g, part), v in scales.items()
        ],
        "per_action_ms": per_action_ms,
        "gap_overhead_ms": gaps,
        "split_by_base": [
            {"component": c, "layers": list(span)}
            for c, named in spans.items()
            for span in named.values()
            if len({n for n, g in groups[c].items() if set(g) & set(span)}) > 1
        ],
    }


TERMS = ("a", "b")
"""The size-dependent terms of a layer's curve (``Quadratic``: ``a * x^2 + b * x``) split by the base."""


def _split_by_prior(
    base: CostModel,
    layers: dict[str, list[LayerCost]],
    spans: Groups,
    fitted: dict[tuple[str, str, int], float],
) -> dict[tuple[str, str, int], float]:
    """Within each of ``spans`` (per component, the layer ranges no traced stage boundary falls inside:
    ``_groups(runs, "cuts")``), the traces measured only the range's total, so how the fit's groups
    divided it among the range's layers is whatever corner the non-negative fit landed on (on the
    paired multi-image runs, a block's backward at 0). So each term of the refitted ``layers``' curves
    summed over the range (per phase and parallel key: ``a`` and ``b`` of the layers priced per token,
    those of the ``per_label`` layers, and the per-call constants) is split among its layers in the
    base's proportions: every layer's term becomes the base's times the range's refitted total over its
    base total. A traced stage (a union of ranges) keeps its fitted time for every sample; a cut inside
    a range is priced by the base's split of the refitted total. Where a range holds one group (every
    range of ``cuts``), nothing changes. A layer whose curve of that phase is a measured table keeps its
    group's scale. ``fitted``: (component, phase, layer) -> its group's scale (``v_g``). Returns, for the
    layers split here, the factor of their linear term (the split backward's extra share is of it)."""
    out: dict[tuple[str, str, int], float] = {}
    for comp, named in spans.items():
        prior = base.component(comp).layers
        for span in named.values():
            for phase in ("fwd", "bwd"):
                members = [
                    i
                    for i in span
                    if (comp, phase, i) in fitted
                    and not any(q.table for q in getattr(prior[i], phase).values())
                ]
                if len(members) < 2:
                    continue
                weight = {i: _phase_weight(base, comp, i, phase) for i in members}
                curves = {i: dict(getattr(layers[comp][i], phase)) for i in members}
                for key in getattr(prior[members[0]], phase):
                    have = [i for i in members if key in getattr(prior[i], phase)]
                    factors: dict[tuple[bool, str], float | None] = {}
                    for per_label in (False, True):
                        same = [i for i in have if prior[i].per_label == per_label]
                        for term in TERMS:
                            factors[(per_label, term)] = _share(
                                [(weight[i], getattr(getattr(prior[i], phase)[key], term), getattr(curves[i][key], term)) for i in same]
                            )  # fmt: skip
                    constant = _share(
                        [(weight[i], getattr(prior[i], phase)[key].c, curves[i][key].c) for i in have]
                    )
                    for i in have:
                        q, p = getattr(prior[i], phase)[key], prior[i].per_label
                        curves[i][key] = Quadratic(
                            q.a * factors[(p, "a")] if factors[(p, "a")] is not None else curves[i][key].a,
                            q.b * factors[(p, "b")] if factors[(p, "b")] is not None else curves[i][key].b,
                            q.c * constant if constant is not None else curves[i][key].c,
                        )
                        if key == min(getattr(prior[i], phase)):
                            f = factors[(p, "b")] if q.b > 0 else factors[(p, "a")]
                            out[(comp, phase, i)] = fitted[(comp, phase, i)] if f is None else f
                for i in members:
                    layers[comp][i] = replace(layers[comp][i], **{phase: curves[i]})
    return out


def _share(terms: list[tuple[float, float, float]]) -> float | None:
    """The refitted total of a term over the base's, both weighted (``(weight, base, refitted)`` per
    layer); None where the base's total is 0 (nothing to split)."""
    total = sum(w * b for w, b, _ in terms)
    return sum(w * r for w, _, r in terms) / total if total > 0 else None


def _phase_weight(base: CostModel, comp: str, i: int, phase: str) -> float:
    """How much of layer ``i``'s stored ``phase`` curve it runs: a frozen layer's backward only its
    input-gradient share, or nothing where no earlier layer trains (``CostModel._bwd_quadratic``)."""
    layer = base.component(comp).layers[i]
    if phase == "fwd" or layer.trainable:
        return 1.0
    return layer.bwd_input_fraction if base.input_grad_needed(comp, i) else 0.0


def _layer_constant(base: CostModel, comp: str, i: int, phase: str) -> float:
    """The per-call constant of layer ``i``'s ``phase`` at TP 1, CP 1 (its one-call time on nothing)."""
    return base.layer_ms(comp, i, (), phase, 1, 1, 1)
