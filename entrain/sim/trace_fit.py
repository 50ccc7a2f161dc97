"""Refit a cost model from a real run's trace (``entrain profile --from-trace RUN``).

A run folder written by ``entrain train --trace`` holds every rank's actions with their durations
(``trace.json``), the Plans that ran (``plan.json``) and the run's cost model (``config.json``: its
preset or ``--profile``). For each compute action the run's cost model predicts
``variable + constant`` ms (``PlanCosts.compute_ms``: the per-unit quadratics of the stage's layers
over the action's samples, and the layers' per-call constants). Per stage and phase (forward;
backward = ``B``, or ``I`` + ``W`` of one (sub-)microbatch) a least-squares line

    measured_ms = alpha * predicted_variable_ms + beta

gives the stage's scale of the per-layer curves (``alpha``) and its per-call constant (``beta``).
What the profile cannot see, the rank's time spent outside compute actions but not waiting (the
gaps between consecutive actions: per-action dispatch; posting a send; a receive whose message had
arrived: the 10th percentile of the run's receive durations), per compute action, is the hardware's
``action_overhead_ms`` (the ranks' mean, weighted by their actions): the simulator charges it once
per action however many layers the stage holds, so a layout with more or fewer stages than the run's
pays it per stage (spread over the traced stage's layers, as it was before, a one-layer stage of
another layout paid a fraction of it).
The new profile has the base's schema and layers: each layer of a stage gets its curves scaled by
``alpha`` and ``beta / layers`` as its constant (a mixture-of-experts layer's measured expert timing,
``ExpertTiming``, that phase's by ``alpha`` too); a split backward's input-gradient share is the
measured ``I / (I + W)``. Documented in docs/profiling.md (``Refit from a trace``)."""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from entrain.core.costs.costmodel import PROFILE_SOURCE, CostModel, LayerCost, Quadratic
from entrain.core.costs.presets import fitted_kind
from entrain.core.errors import ConfigError
from entrain.core.ir.plan import ActionKind, Plan
from entrain.core.schedules.action_costs import PlanCosts

__all__ = [
    "TracedRun",
    "joint_refit",
    "StageFit",
    "action_overhead_ms",
    "load_run",
    "fit_stages",
    "rank_overheads",
    "refit",
    "stage_errors",
]

RECV_COST_QUANTILE = 0.1
"""A receive's own cost: this quantile of the run's receive durations (the ones that did not wait)."""


@dataclass
class TracedRun:
    folder: str
    plan: Plan
    events: list[dict]
    """Compute and transfer events (``ph == "X"``) of the TP-rank-0 processes."""
    base: CostModel
    tp: int
    metrics: list[dict]
    config: dict
    """config.json (``device``, ``precision`` the trace was measured on and in)."""


@dataclass(frozen=True)
class StageFit:
    stage: int
    phase: str
    """``fwd`` or ``bwd``."""
    alpha: float
    beta_ms: float
    num_actions: int
    r2: float
    worst_rel_residual: float
    sizes: tuple[float, ...]
    """Tokens of each fitted action (the stage's units over its samples)."""
    measured_ms: tuple[float, ...]


def _read_json(folder: str, name: str):
    path = os.path.join(folder, name)
    try:
        with open(path) as f:
            return json.load(f) if name.endswith(".json") else [json.loads(x) for x in f if x.strip()]
    except FileNotFoundError:
        hint = " (train with --trace)" if name == "trace.json" else " (not a run folder of entrain train)"
        raise ConfigError(f"--from-trace {path}: missing{hint}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"--from-trace {path}: not valid JSON ({e})") from None


def load_run(folder: str, cost_of: Callable[[dict], CostModel]) -> TracedRun:
    """The run folder's Plans, trace events, cost model (``cost_of(config.json's spec)``) and metrics
    (ConfigError naming the file)."""
    config = _read_json(folder, "config.json")
    spec = config.get("spec", {})
    plan = Plan.from_json(_read_json(folder, "plan.json"))
    trace = _read_json(folder, "trace.json")
    tp = int(spec.get("tp") or 1)
    events = _after_warmup(
        [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e["pid"] % tp == 0]
    )
    if not any(e["cat"] == "compute" for e in events):
        raise ConfigError(f"--from-trace {os.path.join(folder, 'trace.json')}: no compute actions traced")
    metrics = _read_json(folder, "metrics.jsonl")
    return TracedRun(folder, plan, events, cost_of(spec), tp, metrics, config)


def _after_warmup(events: list[dict]) -> list[dict]:
    """The events after the run's first traced step, when it has later ones: the first step pays the
    first calls and grows the allocator's heap (kept from then on: ``entrain.runtime.cpu_allocator``),
    e.g. a 66 ms first LLM forward against 5-11 ms later on chartqa; the benchmarks drop it too."""
    steps = {e["args"]["step"] for e in events}
    if len(steps) < 2:
        return events
    return [e for e in events if e["args"]["step"] != min(steps)]


def _ids(run: TracedRun, e: dict) -> tuple[str, ...]:
    a = e["args"]
    layout = run.plan.layout
    replica, _ = layout.replica_of(e["pid"] // run.tp)
    mb = run.plan.iterations[a["step"]].microbatches[replica][a["mb"]]
    subs = mb.encoder_subs if layout.stages[a["stage"]].component == "encoder" else mb.llm_subs
    return tuple(subs[a["sub"]])


def _constants(costs: PlanCosts, stage: int) -> dict[str, float]:
    """Per-call constant of each phase of ``stage`` (``PlanCosts``' closed form)."""
    coefs = costs._phase_coefs[stage]
    return {phase: coefs[phase][2] for phase in ("fwd", "bwd", "bwd_split")}


def _lockstep(run: TracedRun) -> dict[int, tuple[float, tuple[str, ...]]]:
    """Per compute event (``id``) of a stage with mixture-of-experts layers in a run with expert
    parallelism: (its duration from the latest start of that action over its EP group's replicas,
    the sample ids of the group's heaviest one by the run's cost model). The simulator starts such an
    action on every replica of the group at once and prices it as its heaviest replica's
    (``entrain.sim.executor``); a replica whose input came first waits inside the action at the first
    all-to-all, time that is neither its compute nor its samples'. Empty without expert parallelism."""
    layout = run.plan.layout
    ep = max(c.ep for c in layout.components.values())
    if ep <= 1:
        return {}
    costs = PlanCosts(layout, run.base, run.plan.samples)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for e in run.events:
        a = e["args"]
        if ActionKind(a["kind"]).is_compute and costs.expert_stages[a["stage"]]:
            replica, _ = layout.replica_of(e["pid"] // run.tp)
            groups[(a["step"], replica // ep, a["kind"], a["stage"], a["mb"], a["sub"])].append(e)
    out: dict[int, tuple[float, tuple[str, ...]]] = {}
    for (_, _, kind, stage, _, _), evs in groups.items():
        start = max(e["ts"] for e in evs)
        ids = max((_ids(run, e) for e in evs), key=lambda i: costs.compute_ms(stage, ActionKind(kind), i))
        for e in evs:
            out[id(e)] = (max(0.0, e["ts"] + e["dur"] - start), ids)
    return out


def _traced_computes(run: TracedRun) -> list[tuple[int, str, tuple[str, ...], int, float]]:
    """(stage, phase, sample ids, compute actions, measured ms): each forward, and each (sub-)microbatch
    backward (``B``, or ``I`` + ``W`` summed: 2 actions); with expert parallelism, an action of a stage
    with experts as ``_lockstep`` measures it."""
    rows: dict[tuple, list] = {}
    lockstep = _lockstep(run)
    for e in run.events:
        a = e["args"]
        if not ActionKind(a["kind"]).is_compute:
            continue
        phase = "fwd" if a["kind"] == "F" else "bwd"
        key = (e["pid"], a["step"], a["stage"], a["mb"], a["sub"], phase)
        dur_us, ids = lockstep.get(id(e), (e["dur"], None))
        row = rows.setdefault(key, [a["stage"], phase, ids or _ids(run, e), 0, 0.0])
        row[3] += 1
        row[4] += dur_us / 1e3
    return [tuple(r) for r in rows.values()]


def _samples(run: TracedRun, costs: PlanCosts) -> dict[tuple[int, str], list[tuple[float, float, float]]]:
    """(stage, phase) -> [(measured ms, predicted variable ms, tokens)]: each traced compute
    (``_traced_computes``) as ``PlanCosts`` prices its layers (a split backward as ``bwd_split``), less
    the per-call constant."""
    out: dict[tuple[int, str], list] = defaultdict(list)
    for stage, phase, ids, num_actions, ms in _traced_computes(run):
        priced = "bwd_split" if num_actions > 1 else phase
        variable = costs._phase_ms(stage, priced, ids) - _constants(costs, stage)[priced]
        out[(stage, phase)].append((ms, variable, costs.tokens(stage, ids)))
    return out


SIZE_SPREAD_MIN = 0.1
"""Coefficient of variation of a stage's predicted variable times below which its actions' sizes are
too alike to tell the per-layer slope from the per-call constant (chartqa's capped images: 4 %): the
fit then keeps the base's split and scales both, ``measured = s * (variable + constant)``."""


def _line(points: list[tuple[float, float, float]], constant_ms: float) -> tuple[float, float, float, float]:
    """(alpha, beta, r2, worst relative residual) of ``measured = alpha * predicted + beta`` by least squares, both
    non-negative (a negative beta is dropped and alpha refitted alone); sizes too alike
    (``SIZE_SPREAD_MIN``) or a negative alpha: the scale of the base's line (``constant_ms`` its constant)."""
    y = np.array([p[0] for p in points])
    x = np.array([p[1] for p in points])
    alike = len(points) < 2 or float(x.std()) <= SIZE_SPREAD_MIN * abs(float(x.mean()))
    alpha, beta = -1.0, 0.0
    if not alike:
        alpha, beta = np.linalg.lstsq(np.column_stack([x, np.ones_like(x)]), y, rcond=None)[0]
        if beta < 0 and float(x @ x) > 0:
            alpha, beta = float(x @ y / (x @ x)), 0.0
    if alpha < 0:
        alpha, beta = _scale(x, y, constant_ms)
    resid = y - (alpha * x + beta)
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / total if total > 0 else 1.0
    worst = float(np.max(np.abs(resid) / np.maximum(y, 1e-9)))
    return float(alpha), float(beta), r2, worst


def _scale(x: np.ndarray, y: np.ndarray, constant_ms: float) -> tuple[float, float]:
    """(alpha, beta) of ``y = s * (x + constant_ms)`` by least squares (s >= 0); a base line of zero:
    (0, mean)."""
    z = x + constant_ms
    if float(z @ z) <= 0:
        return 0.0, float(y.mean())
    s = max(0.0, float(z @ y / (z @ z)))
    return s, s * constant_ms


def fit_stages(run: TracedRun) -> list[StageFit]:
    """One ``StageFit`` per stage and phase with traced actions."""
    costs = PlanCosts(run.plan.layout, run.base, run.plan.samples)
    fits = []
    for (stage, phase), points in sorted(_samples(run, costs).items()):
        alpha, beta, r2, worst = _line(points, _constants(costs, stage)[phase])
        sizes, measured = tuple(p[2] for p in points), tuple(p[0] for p in points)
        fits.append(StageFit(stage, phase, alpha, beta, len(points), r2, worst, sizes, measured))
    return fits


def _by_rank_step(run: TracedRun) -> dict[tuple[int, int], list[dict]]:
    groups: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for e in run.events:
        groups[(e["pid"], e["args"]["step"])].append(e)
    for evs in groups.values():
        evs.sort(key=lambda e: e["ts"])
    return groups


def _recv_costs_ms(run: TracedRun) -> dict[int, float]:
    """Per rank: a receive's own cost, the ``RECV_COST_QUANTILE`` of every receive of the run (a
    rank whose receives all wait, as the first stage's for gradients, would show only waits)."""
    durs = [e["dur"] / 1e3 for e in run.events if e["args"]["kind"].startswith("RECV")]
    cost = float(np.quantile(durs, RECV_COST_QUANTILE)) if durs else 0.0
    return {e["pid"]: cost for e in run.events}


def _overhead_ms(evs: list[dict], recv_ms: float) -> float:
    """A rank's time in one step outside compute actions but not waiting: gaps, send posts, receives'
    own cost."""
    gaps = sum(max(0.0, b["ts"] - (a["ts"] + a["dur"])) for a, b in zip(evs, evs[1:])) / 1e3
    comm = 0.0
    for e in evs:
        kind = e["args"]["kind"]
        if kind.startswith("SEND"):
            comm += e["dur"] / 1e3
        elif kind.startswith("RECV"):
            comm += min(e["dur"] / 1e3, recv_ms)
    return gaps + comm


def _compute_units(evs: list[dict]) -> int:
    """Compute actions (``F``, ``B``, ``I``, ``W``: each one dispatch)."""
    return sum(1 for e in evs if e["args"]["kind"] in ("F", "B", "I", "W"))


def rank_overheads(run: TracedRun) -> dict[int, float]:
    """Per process rank: its mean overhead (``_overhead_ms``) per compute action, over the steps."""
    recv = _recv_costs_ms(run)
    per_rank: dict[int, list[float]] = defaultdict(list)
    for (pid, _), evs in _by_rank_step(run).items():
        units = _compute_units(evs)
        if units:
            per_rank[pid].append(_overhead_ms(evs, recv.get(pid, 0.0)) / units)
    return {pid: statistics.fmean(v) for pid, v in per_rank.items()}


def action_overhead_ms(run: TracedRun, overheads: dict[int, float]) -> float:
    """The hardware's per-action overhead: the ranks' ``rank_overheads`` weighted by their compute
    actions (``_compute_units``) over the run."""
    units: dict[int, int] = defaultdict(int)
    for (pid, _), evs in _by_rank_step(run).items():
        units[pid] += _compute_units(evs)
    total = sum(units[p] for p in overheads)
    return sum(overheads[p] * units[p] for p in overheads) / total if total else 0.0


def _input_fractions(run: TracedRun) -> dict[int, float]:
    """Per stage with split backwards: measured ``I / (I + W)``."""
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in run.events:
        kind = e["args"]["kind"]
        if kind in ("I", "W"):
            sums[e["args"]["stage"]][kind == "W"] += e["dur"]
    return {s: i / (i + w) for s, (i, w) in sums.items() if i + w > 0}


def _layer(layer: LayerCost, phase: str, alpha: float, constant_ms: float) -> LayerCost:
    """``layer`` with ``phase``'s curves scaled by ``alpha`` (``_curve``), and a mixture-of-experts
    layer's measured expert timing of that phase (``ExpertTiming``: slot, call and router ms, which
    price its busiest rank's extra tokens beside the curves) by the same ``alpha``."""
    field = layer.fwd if phase == "fwd" else layer.bwd
    out = replace(layer, **{phase: {key: _curve(q, alpha, constant_ms) for key, q in field.items()}})
    x = layer.experts
    if x is None or x.measured is None:
        return out
    m, p = x.measured, phase
    timing = replace(
        m,
        **{
            f"{p}_slot_ms": getattr(m, f"{p}_slot_ms") * alpha,
            f"{p}_call_ms": getattr(m, f"{p}_call_ms") * alpha,
            f"router_{p}_ms_per_token": getattr(m, f"router_{p}_ms_per_token") * alpha,
        },
    )
    return replace(out, experts=replace(x, measured=timing))


def _curve(q: Quadratic, alpha: float, constant_ms: float) -> Quadratic:
    """``q``'s size-dependent part times ``alpha``, its per-call constant ``constant_ms``."""
    if not q.table:
        return Quadratic(q.a * alpha, q.b * alpha, constant_ms)
    scaled = q.scaled(alpha)
    shift = constant_ms - scaled.constant_ms
    table = tuple((x, max(0.0, ms + shift)) for x, ms in scaled.table)
    return Quadratic(scaled.a, scaled.b, constant_ms, table)


def refit(run: TracedRun, fits: list[StageFit], overheads: dict[int, float]) -> CostModel:
    """The base cost model with each traced stage's layers refitted (see the module docstring)."""
    layout = run.plan.layout
    layers = {c: list(run.base.component(c).layers) for c in ("encoder", "llm")}
    fractions = _input_fractions(run)
    for fit in fits:
        spec = layout.stages[fit.stage]
        span = range(spec.first_layer, spec.end_layer)
        for i in span:
            layer, constant = layers[spec.component][i], fit.beta_ms / len(span)
            if fit.phase == "bwd" and fit.stage in fractions:  # split: the constant held the split's own
                constant = max(0.0, constant - layer.split_extra_ms)
                layer = replace(layer, bwd_input_fraction=fractions[fit.stage])
            layer = _layer(layer, fit.phase, fit.alpha, constant)
            layers[spec.component][i] = layer
    notes = {
        "source": PROFILE_SOURCE,
        "from_trace": os.path.abspath(run.folder),
        "base": run.base.notes.get("source", run.base.hardware.name),
        "device": run.config.get("device"),
        "stage_fits": [
            {
                "stage": f.stage,
                "phase": f.phase,
                "alpha": f.alpha,
                "beta_ms": f.beta_ms,
                "actions": f.num_actions,
                "r2": f.r2,
            }
            for f in fits
        ],  # fmt: skip
        "overhead_ms_per_action": {str(p): v for p, v in sorted(overheads.items())},
    }
    return _refitted(run, layers, action_overhead_ms(run, overheads), notes)


def _refitted(
    run: TracedRun, layers: dict[str, list[LayerCost]], overhead_ms: float, notes: dict
) -> CostModel:
    """``run``'s base cost model with ``layers``, per-action ``overhead_ms``, ``notes`` (and the run's
    precision in them)."""
    if run.config.get("precision"):
        notes["precision"] = run.config["precision"]
    base = run.base
    return replace(
        base,
        hardware=replace(base.hardware, action_overhead_ms=overhead_ms),
        encoder=replace(base.encoder, layers=tuple(layers["encoder"])),
        llm=replace(base.llm, layers=tuple(layers["llm"])),
        notes=notes,
    )


def stage_errors(run: TracedRun, cost: CostModel) -> dict:
    """How well ``cost`` predicts the run's stage times: per (step, rank), the simulated busy time of
    the rank (``entrain.sim``, the run's Plans) against its measured occupied time (compute actions
    plus ``_overhead_ms``); the mean and worst relative error, and the same for the step's span
    (first action start to last action end, every rank)."""
    from entrain.sim.executor import simulate_plan

    sims = simulate_plan(run.plan, cost, trace_iterations=0)
    recv = _recv_costs_ms(run)
    busy_errors = []
    for (pid, step), evs in sorted(_by_rank_step(run).items()):
        real = sum(e["dur"] for e in evs if e["cat"] == "compute") / 1e3 + _overhead_ms(
            evs, recv.get(pid, 0.0)
        )
        plan_rank = pid // run.tp
        replica, _ = run.plan.layout.replica_of(plan_rank)
        sim = sims[step].replicas[replica].busy_ms[plan_rank]
        busy_errors.append(abs(sim - real) / real)
    span_errors = []
    for step in sorted({e["args"]["step"] for e in run.events}):
        evs = [e for e in run.events if e["args"]["step"] == step]
        real = (max(e["ts"] + e["dur"] for e in evs) - min(e["ts"] for e in evs)) / 1e3
        sim = max(r.makespan_ms for r in sims[step].replicas)
        span_errors.append(abs(sim - real) / real)
    return {
        "busy_mean_rel_error": statistics.fmean(busy_errors),
        "busy_max_rel_error": max(busy_errors),
        "span_mean_rel_error": statistics.fmean(span_errors),
        "span_max_rel_error": max(span_errors),
    }


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
"""Each run with its ``_traced_computes``."""


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
    """One row per traced compute (``_traced_computes``): the predicted ms of each group part it
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
    share their range's refitted total in the base's proportions (``_split_by_prior``)."""
    from scipy.optimize import nnls

    if by not in FIT_GROUPS:
        raise ConfigError(f"fit groups {by!r}: choose from {', '.join(FIT_GROUPS)}")
    base = runs[0].base
    if any(r.base.to_json()["components"] != base.to_json()["components"] for r in runs[1:]):
        raise ConfigError("--also-trace: every run must have been planned with the same cost model")
    traced = [(run, _traced_computes(run)) for run in runs]
    groups, split_fitted = _groups(runs, by), _split_fitted(traced)
    rows = _joint_rows(traced, groups, split_fitted)
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
    scales = {c: float(solution[index[c]]) for c in columns}
    per_action_ms = float(solution[-1])
    layers = {c: list(base.component(c).layers) for c in ("encoder", "llm")}
    fitted: dict[tuple[str, str, int], float] = {}
    for (comp, phase, name, part), s_g in scales.items():
        if part == "const" or phase == "split":
            continue
        c_g = scales.get((comp, phase, name, "const"), 1.0)
        for i in groups[comp][name]:
            const = _layer_constant(base, comp, i, phase)
            layers[comp][i] = _layer(layers[comp][i], phase, s_g, c_g * const)
            fitted[(comp, phase, i)] = s_g
    spans = _groups(runs, "cuts")
    fitted |= _split_by_prior(base, layers, spans, fitted)
    for (comp, phase, i), s_i in fitted.items():
        if phase == "bwd" and comp in split_fitted:
            extra = scales[(comp, "split", "", "var")] / s_i if s_i > 0 else 0.0
            split_ms = scales[(comp, "split", "", "const")]
            layers[comp][i] = replace(layers[comp][i], split_extra_fraction=extra, split_extra_ms=split_ms)
    for run in runs:
        for stage, fraction in _input_fractions(run).items():
            spec = run.plan.layout.stages[stage]
            for i in range(spec.first_layer, spec.end_layer):
                layers[spec.component][i] = replace(layers[spec.component][i], bwd_input_fraction=fraction)
    gaps = statistics.fmean(action_overhead_ms(r, rank_overheads(r)) for r in runs)
    notes = {
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
    return _refitted(runs[0], layers, gaps + per_action_ms, notes)


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
