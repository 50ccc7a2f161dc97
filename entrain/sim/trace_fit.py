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
measured ``I / (I + W)``. The run's time outside its traced actions (the end-of-step phase: clipping,
the optimizer step, the step's collectives) is the hardware's ``step_end_ms`` (``entrain.sim.step_end_fit``).
Several runs of other stage cuts, one fit: ``entrain.sim.trace_joint_fit``. Documented in docs/profiling.md
(``Refit from a trace``)."""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from entrain.core.costs.costmodel import PROFILE_SOURCE, CostModel, LayerCost, Quadratic
from entrain.core.errors import ConfigError
from entrain.core.ir.plan import ActionKind, Plan
from entrain.core.schedules.action_costs import PlanCosts
from entrain.sim.step_end_fit import fit_step_end

__all__ = [
    "TracedRun",
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


def traced_computes(run: TracedRun) -> list[tuple[int, str, tuple[str, ...], int, float]]:
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
    (``traced_computes``) as ``PlanCosts`` prices its layers (a split backward as ``bwd_split``), less
    the per-call constant."""
    out: dict[tuple[int, str], list] = defaultdict(list)
    for stage, phase, ids, num_actions, ms in traced_computes(run):
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


def input_fractions(run: TracedRun) -> dict[int, float]:
    """Per stage with split backwards: measured ``I / (I + W)``."""
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in run.events:
        kind = e["args"]["kind"]
        if kind in ("I", "W"):
            sums[e["args"]["stage"]][kind == "W"] += e["dur"]
    return {s: i / (i + w) for s, (i, w) in sums.items() if i + w > 0}


def scaled_layer(layer: LayerCost, phase: str, alpha: float, constant_ms: float) -> LayerCost:
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
    fractions = input_fractions(run)
    for fit in fits:
        spec = layout.stages[fit.stage]
        span = range(spec.first_layer, spec.end_layer)
        for i in span:
            layer, constant = layers[spec.component][i], fit.beta_ms / len(span)
            if fit.phase == "bwd" and fit.stage in fractions:  # split: the constant held the split's own
                constant = max(0.0, constant - layer.split_extra_ms)
                layer = replace(layer, bwd_input_fraction=fractions[fit.stage])
            layer = scaled_layer(layer, fit.phase, fit.alpha, constant)
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
    return refitted_model(run, layers, action_overhead_ms(run, overheads), notes)


def refitted_model(
    run: TracedRun,
    layers: dict[str, list[LayerCost]],
    overhead_ms: float,
    notes: dict,
    runs: list[TracedRun] | None = None,
) -> CostModel:
    """``run``'s base cost model with ``layers``, per-action ``overhead_ms``, ``notes`` (and the run's
    precision in them), and the end-of-step phase fitted on ``runs`` (default: ``run``;
    ``step_end_fit.fit_step_end``, its fit in ``notes["step_end"]``)."""
    if run.config.get("precision"):
        notes["precision"] = run.config["precision"]
    base = run.base
    step_ms, per_byte, step_notes = fit_step_end(runs or [run], base.hardware)
    if step_notes:
        notes["step_end"] = step_notes
    hardware = replace(
        base.hardware,
        action_overhead_ms=overhead_ms,
        step_end_ms=step_ms,
        step_end_ms_per_param_byte=per_byte,
    )
    return replace(
        base,
        hardware=hardware,
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
