"""``entrain profile --from-trace RUN --out FILE``: a profile refitted from a run's ``trace.json``
(``entrain.sim.trace_fit``; docs/profiling.md, "Refit from a trace"), in the schema of every profile."""

from __future__ import annotations

import argparse
import sys

from entrain.cli.common import emit_json


def _cost_of(spec: dict):
    from entrain.cli.plot_trace import run_model_config

    return run_model_config(spec).cost_model()


def _fit_json(run, fit) -> dict:
    """One stage and phase in the ``fits`` shape of ``entrain/schemas/profile.json``."""
    spec = run.plan.layout.stages[fit.stage]
    sizes = [max(1, round(t)) for t in fit.sizes]
    ms = list(fit.measured_ms)
    if len(sizes) < 2:  # one traced action: the schema's pairs hold it twice
        sizes, ms = sizes * 2, ms * 2
    return {
        "component": spec.component,
        "layer": f"stage {fit.stage} (layers {spec.first_layer}-{spec.end_layer - 1})",
        "kind": "stage",
        "phase": fit.phase,
        "tokens": sizes,
        "ms": ms,
        "r2": min(1.0, fit.r2),
        "worst_rel_residual": fit.worst_rel_residual,
        "table": False,
        "used_r2": min(1.0, fit.r2),
        "used_worst_rel_residual": fit.worst_rel_residual,
    }


def _also_json(run, cost) -> dict:
    """An ``--also-trace`` run and its simulated stage times' errors under its cost model and the fit."""
    from entrain.sim.trace_fit import stage_errors

    return {
        "run": run.folder,
        "errors": {"base": stage_errors(run, run.base), "refit": stage_errors(run, cost)},
    }


def expert_imbalance(metrics: list[dict], skews: dict[int, float] | None = None) -> list[dict]:
    """Per sparse layer of a MoE run, the measured expert imbalance (busiest expert's tokens / the mean
    over its experts) of the ``expert_tokens`` entries of ``metrics.jsonl``'s rows (one per step and
    rank or EP group reporting the layer): their mean and max, and how many there were; empty for a run
    without experts. With ``skews`` (``expert_refit.expert_skews``), each layer's routing skew the
    refitted cost model prices its busiest expert with."""
    by_layer: dict[int, list[float]] = {}
    for row in metrics:
        for e in row.get("expert_tokens", ()):
            by_layer.setdefault(e["layer"], []).append(e["imbalance"])
    return [
        {"layer": layer, "imbalance": sum(v) / len(v), "max_imbalance": max(v), "entries": len(v),
         **({"skew": skews[layer]} if skews and layer in skews else {})}
        for layer, v in sorted(by_layer.items())
    ]  # fmt: skip


def run_from_trace(args: argparse.Namespace) -> int:
    from entrain.sim.expert_refit import refit_experts
    from entrain.sim.trace_fit import fit_stages, load_run, rank_overheads, refit, stage_errors
    from entrain.sim.trace_joint_fit import joint_refit

    run = load_run(args.from_trace, _cost_of)
    also = [load_run(folder, _cost_of) for folder in args.also_trace]
    fits = fit_stages(run)
    overheads = rank_overheads(run)
    cost = joint_refit([run, *also], args.fit_groups) if also else refit(run, fits, overheads)
    cost, skews = refit_experts(cost, run.metrics)  # the busiest expert's routing skew, per sparse layer
    cost.save(args.out)
    errors = {"base": stage_errors(run, run.base), "refit": stage_errors(run, cost)}
    how = f"one fit over {1 + len(also)} runs' layer {args.fit_groups}" if also else f"{len(fits)} stage fits"
    print(
        f"wrote {args.out}: {how} from {sum(len(r.events) for r in (run, *also))} traced actions of "
        f"{', '.join([args.from_trace, *args.also_trace])}; simulated stage times' mean error of "
        f"{args.from_trace} {errors['base']['busy_mean_rel_error']:.1%} (the run's cost model) "
        f"-> {errors['refit']['busy_mean_rel_error']:.1%} (refitted)",
        file=sys.stderr,
    )
    if args.json:
        sizes = [max(1, round(t)) for f in fits for t in f.sizes]
        emit_json(
            {
                "model": cost.model,
                "device": str(run.config.get("device", "unknown")),
                **({"precision": cost.notes["precision"]} if "precision" in cost.notes else {}),
                "tokens": [min(sizes), max(sizes)],
                "out": args.out,
                "layers": f"refitted per layer group ({args.fit_groups}) from the traces"
                if also
                else "refitted per stage from the trace",
                "fits": [_fit_json(run, f) for f in fits],
                "from_trace": {
                    "run": args.from_trace,
                    "errors": errors,
                    "overhead_ms_per_action": {str(p): v for p, v in sorted(overheads.items())},
                    **({"also": [_also_json(r, cost) for r in also]} if also else {}),
                    **({"expert_imbalance": moe} if (moe := expert_imbalance(run.metrics, skews)) else {}),
                },
            }
        )
    return 0
