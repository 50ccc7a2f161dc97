"""Fit the ``cpu-tiny`` cost preset's per-kind scales from traced runs.

The analytic ``cpu-tiny`` (FLOP-proportional layer costs, one rate per component, a 7 ms per-call
constant per component spread evenly over its layers) mispriced the stage cuts Entrain makes on this
CPU: the merger and the full-attention block cost less against the window blocks than their FLOPs say,
a backward split into ``I`` + ``W`` costs more than a whole one, and a compute action costs more than
its layers. This script fits, in one non-negative least squares over every traced compute of the given
runs (``entrain.sim.trace_joint_fit.joint_refit``, layers grouped by kind), per layer kind the scale of the
analytic curves' size-dependent part and of their per-call constant, per component the split
backward's own cost, and the per-action overhead, relative to the analytic preset; and writes them where
the preset reads them (``entrain/core/costs/fits/cpu_tiny.json``: ``CPU_TINY_KIND_SCALES``,
``CPU_TINY_ACTION_OVERHEAD_MS`` in ``entrain/core/costs/presets.py``).

Input: run folders of ``benchmarks/cpu_pipeline.py --paired --keep-runs DIR`` (``DIR/WORKLOAD/roundK/
{entrain,1f1b}``), every workload and round, planned with one cost model. ``--check DIR``: other
passes' run folders, whose Plans the fit then predicts out of sample (median paired ratio Entrain /
1F1B per workload, simulated vs real), with a leave-one-workload-out check of the fit runs.

Run: ``python benchmarks/fit_cpu_tiny.py --runs DIR [--check DIR2 ...]``; writes
``benchmarks/results/cpu_tiny_fit.{md,json}`` and ``entrain/core/costs/fits/cpu_tiny.json`` (``--no-preset``:
the report only). ``tests/core/test_presets.py`` checks that the preset and the report hold the same
numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from preset_fit import write_preset_fit  # benchmarks/preset_fit.py (scripts run from this folder)
from provenance import source, stamped  # benchmarks/provenance.py

from entrain.cli.plot_trace import run_model_config
from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.presets import analytic_cpu_tiny, fitted_kind
from entrain.core.ir.plan import Plan
from entrain.sim.executor import simulate_plan
from entrain.sim.trace_fit import load_run
from entrain.sim.trace_joint_fit import joint_refit

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SYSTEMS = ("1f1b", "entrain")
WARMUP = 1
"""Steps dropped from each run's metrics (as ``cpu_paired.py`` does)."""


def _cost_of(spec: dict) -> CostModel:
    """The analytic ``cpu-tiny`` of the run's model, whatever the run planned with: the fit's base, so
    the scales it finds are the preset's whether or not the runs already had them."""
    return analytic_cpu_tiny(run_model_config(spec).arch())


def _rounds(root: str) -> dict[str, list[str]]:
    """Workload -> its round folders (each holding ``entrain`` and ``1f1b``)."""
    out = {}
    for workload in sorted(os.listdir(root)):
        folder = os.path.join(root, workload)
        rounds = sorted(d for d in os.listdir(folder) if d.startswith("round"))
        if rounds:
            out[workload] = [os.path.join(folder, r) for r in rounds]
    return out


def _real_ms(run: str) -> float:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()][WARMUP:]
    return statistics.median(r["iteration_time_ms"] for r in rows)


def _sim_ms(run: str, cost: CostModel) -> float:
    with open(os.path.join(run, "plan.json")) as f:
        plan = Plan.from_json(json.load(f))
    return statistics.median(
        r.iteration_time_ms for r in simulate_plan(plan, cost, trace_iterations=0)[WARMUP:]
    )


def _ratios(rounds: list[str], cost: CostModel) -> tuple[float, float]:
    """(simulated, real) median paired ratio Entrain / 1F1B over the rounds."""
    real = statistics.median(_real_ms(f"{r}/entrain") / _real_ms(f"{r}/1f1b") for r in rounds)
    sim = statistics.median(_sim_ms(f"{r}/entrain", cost) / _sim_ms(f"{r}/1f1b", cost) for r in rounds)
    return sim, real


def _fit(rounds: dict[str, list[str]]) -> CostModel:
    return joint_refit(
        [load_run(f"{r}/{s}", _cost_of) for rs in rounds.values() for r in rs for s in SYSTEMS], "kinds"
    )


def kind_scales(fitted: CostModel) -> dict[str, dict[str, float]]:
    """Per fitted kind (``presets.fitted_kind``) of the fitted model: its curves against the analytic preset's (the size-dependent
    part and the per-call constant of each phase, at TP 1 CP 1) and its split backward's own cost."""
    base = analytic_cpu_tiny(fitted.model)
    out: dict[str, dict[str, float]] = {}
    for comp in ("encoder", "llm"):
        for new, old in zip(fitted.component(comp).layers, base.component(comp).layers):
            scales = {}
            for phase in ("fwd", "bwd"):
                q, q0 = getattr(new, phase)["tp1cp1"], getattr(old, phase)["tp1cp1"]
                scales[phase] = q.b / q0.b if q0.b else 1.0
                scales[f"{phase}_const"] = q.c / q0.c if q0.c else 1.0
            scales["split_extra_fraction"] = new.split_extra_fraction
            scales["split_extra_ms"] = new.split_extra_ms
            out.setdefault(fitted_kind(new.kind), {k: round(v, 4) for k, v in scales.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", required=True, help="kept run folders of one paired pass (every workload)")
    ap.add_argument("--check", action="append", default=[], help="other passes' kept run folders")
    ap.add_argument(
        "--no-preset", action="store_true", help="write the report only, not entrain/core/costs/fits"
    )
    args = ap.parse_args()
    rounds = _rounds(args.runs)
    fitted = _fit(rounds)
    overhead = fitted.hardware.action_overhead_ms
    scales = kind_scales(fitted)
    rows = []
    for workload, rs in rounds.items():
        sim, real = _ratios(rs, fitted)
        rows.append(("fit runs (in sample)", workload, sim, real))
    for workload in rounds:
        loo = _fit({w: rs for w, rs in rounds.items() if w != workload})
        sim, real = _ratios(rounds[workload], loo)
        rows.append(("fit on the other workloads", workload, sim, real))
    for check in args.check:
        for workload, rs in _rounds(check).items():
            sim, real = _ratios(rs, fitted)
            rows.append((f"other pass: {os.path.basename(os.path.normpath(check))}", workload, sim, real))
    doc = {
        "source": source(),
        "runs": os.path.basename(os.path.normpath(args.runs)),
        "action_overhead_ms": round(overhead, 4),
        "kind_scales": scales,
        "checks": [{"set": s, "workload": w, "sim_ratio": a, "real_ratio": b} for s, w, a, b in rows],
    }
    with open(os.path.join(RESULTS, "cpu_tiny_fit.json"), "w") as f:
        json.dump(doc, f, indent=1)
    lines = [
        "# cpu-tiny fitted from traced runs (`benchmarks/fit_cpu_tiny.py`)",
        "",
        f"One fit by layer kind over every traced compute of `{doc['runs']}` ({sum(map(len, rounds.values()))} "
        f"paired rounds of {', '.join(rounds)}). Scales are against the analytic preset (FLOP-proportional, "
        "7 ms per call per component); kinds fitted as one (`presets.KIND_GROUPS`): the patch embedding with the "
        "window blocks, the final norm, `lm_head` and the loss as `head`. Per-action overhead: "
        f"{overhead:.2f} ms.",
        "",
        "| kind | fwd | bwd | fwd const | bwd const | split extra share | split extra ms/layer |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, s in scales.items():
        lines.append(
            f"| {kind} | {s['fwd']:.3f} | {s['bwd']:.3f} | {s['fwd_const']:.3f} | {s['bwd_const']:.3f} | "
            f"{s['split_extra_fraction']:.3f} | {s['split_extra_ms']:.3f} |"
        )
    lines += ["", "Paired ratio Entrain / 1F1B (median over rounds), simulated with the fit vs real:", ""]
    lines += ["| runs | workload | simulated | real | error |", "|---|---|---|---|---|"]
    for s, w, sim, real in rows:
        lines.append(f"| {s} | {w} | {sim:.3f} | {real:.3f} | {sim / real - 1:+.1%} |")
    with open(os.path.join(RESULTS, "cpu_tiny_fit.md"), "w") as f:
        f.write(stamped("\n".join(lines) + "\n", doc["source"]))
    print("\n".join(lines))
    if not args.no_preset:
        write_preset_fit("cpu_tiny", {k: doc[k] for k in ("runs", "action_overhead_ms", "kind_scales")})


if __name__ == "__main__":
    main()
