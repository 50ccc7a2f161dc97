"""``entrain plot-trace RUN_DIR --out FILE.png``: the Gantt chart of a real run (``entrain train
--trace``) beside the simulated Gantt of the same Plan, so the balance of a real run can be seen.

Top: replica 0's compute actions of step ``--step`` as measured on the ranks (``RUN_DIR/trace.json``,
times from the step's first action). Bottom: the same iteration of ``RUN_DIR/plan.json`` run by the
discrete-event simulator under the run's cost model (its ``--hardware`` preset or ``--profile``, as
recorded in ``RUN_DIR/config.json``). Both panels share the time axis.
"""

from __future__ import annotations

import argparse
import json
import os

from entrain.cli.common import add_shared_flags
from entrain.core.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plot-trace", help="real Gantt (train --trace) beside the simulated Gantt of the same plan",
        description=__doc__,
    )  # fmt: skip
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by entrain train --trace")
    p.add_argument("--out", required=True, metavar="FILE.png", help="image to write")
    p.add_argument("--step", type=int, default=None, help="step to draw (default: the last traced one)")
    add_shared_flags(p, "plot-trace", "json")
    p.set_defaults(func=run)


def _read(run_dir: str, name: str) -> dict:
    path = os.path.join(run_dir, name)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        hint = " (train with --trace)" if name == "trace.json" else ""
        raise ConfigError(f"{path}: missing{hint}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None


def real_bars(events: list[dict], layout, step: int) -> tuple[list, float]:
    """Replica 0's compute boxes of ``step`` (ms from the step's first action of any rank) and the
    step's span in ms."""
    mine = [e for e in events if e.get("ph") == "X" and e["args"]["step"] == step]
    if not mine:
        raise ConfigError(f"no traced actions of step {step}")
    t0 = min(e["ts"] for e in mine)
    t1 = max(e["ts"] + e["dur"] for e in mine)
    bars = []
    for e in mine:
        replica, pp_rank = layout.replica_of(e["pid"])
        if e["cat"] == "compute" and replica == 0:
            a = e["args"]
            start = (e["ts"] - t0) / 1e3
            bars.append(
                (pp_rank, layout.stages[a["stage"]].component, a["kind"], start, start + e["dur"] / 1e3)
            )
    return bars, (t1 - t0) / 1e3


def run(args: argparse.Namespace) -> int:
    from entrain.core.ir.plan import Plan
    from entrain.core.schedules.action_costs import PlanCosts
    from entrain.sim.executor import run_iteration
    from entrain.sim.plots import gantt_bars, pyplot, span_bars

    trace = _read(args.run_dir, "trace.json")
    plan = Plan.from_json(_read(args.run_dir, "plan.json"))
    spec = _read(args.run_dir, "config.json")["spec"]
    events = trace["traceEvents"]
    steps = sorted({e["args"]["step"] for e in events if e.get("ph") == "X"})
    step = steps[-1] if args.step is None and steps else args.step
    if step is None or not 0 <= step < len(plan.iterations):
        raise ConfigError(f"--step {step}: the plan has {len(plan.iterations)} iterations (traced: {steps})")
    layout = plan.layout
    bars, real_ms = real_bars(events, layout, step)
    cost = run_model_config(spec).cost_model()
    sim = run_iteration(layout, plan.iterations[step], PlanCosts(layout, cost, plan.samples), trace=True)
    plt = pyplot()
    p = layout.ranks_per_replica
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(14, 0.9 * p + 3), sharex=True)
    name = os.path.basename(os.path.normpath(args.run_dir))
    gantt_bars(top, bars, p, f"real run {name}: step {step}, replica 0 ({real_ms / 1e3:.3f} s)")
    gantt_bars(
        bottom,
        span_bars(layout, sim.replicas[0].spans),
        p,
        f"simulated, same plan under {cost.hardware.name} ({sim.iteration_time_ms / 1e3:.3f} s with all-reduce)",
    )
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    plt.close(fig)
    summary = {"step": step, "real_ms": real_ms, "simulated_ms": sim.iteration_time_ms, "out": args.out}
    if args.json:
        from entrain.cli.common import emit_json

        emit_json(summary)
    else:
        print(
            f"wrote {args.out}: step {step}, real {real_ms:.1f} ms, simulated {sim.iteration_time_ms:.1f} ms"
        )
    return 0


def run_model_config(spec: dict):
    """The run's ``ModelConfig`` from config.json's flat ``spec``."""
    from dataclasses import fields

    from entrain.config import ModelConfig

    given = {f.name: spec[f.name] for f in fields(ModelConfig) if f.name in spec and f.name != "name"}
    return ModelConfig(**{**given, "name": spec["model"], "freeze": tuple(spec.get("freeze") or ())})
