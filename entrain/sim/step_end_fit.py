"""The end-of-step phase of traced runs: ``HardwareSpec.step_end_ms`` and
``step_end_ms_per_param_byte``, fitted by ``entrain profile --from-trace`` (``trace_fit.refit`` and
``trace_joint_fit.joint_refit`` both).

A traced step's actions span less than the step the run measured (``metrics.jsonl``'s
``iteration_time_ms``: from after the step's barrier to the end of its optimizer step, the slowest
rank): the label-count all-reduce and, at expert parallelism, the action check before the first
action; after the last one the wait for the last sends, the DP gradient all-reduce, the loss and
gradient-norm all-reduces, clipping and the optimizer step. Per kept step that time outside the traced
span, less the part of the DP gradient all-reduce the simulator already prices past each rank's last
action (``PlanCosts.allreduce_ms``, not counted twice), is the measured end of step. Per run, its
median over the steps against the trainable parameter bytes of the run's heaviest pipeline rank
(``action_costs.rank_param_bytes``): a least-squares line ``ms = step_end_ms +
step_end_ms_per_param_byte * bytes`` (both non-negative) over the runs, where their layouts' bytes
differ enough to tell the slope (``BYTES_SPREAD_MIN``); else the base's slope and the constant alone.
Documented in docs/profiling.md (``Refit from a trace``)."""

from __future__ import annotations

import statistics
from collections import defaultdict

import numpy as np

from entrain.core.costs.costmodel import HardwareSpec
from entrain.core.errors import ConfigError
from entrain.core.schedules.action_costs import PlanCosts, rank_param_bytes

__all__ = ["BYTES_SPREAD_MIN", "measured_step_ends", "fit_step_end"]

BYTES_SPREAD_MIN = 0.1
"""Coefficient of variation of the runs' heaviest-rank parameter bytes below which the runs cannot
tell the per-byte part from the constant (one run, or runs of one layout): the base's per-byte part is
kept and the constant fitted alone."""


def _iteration_ms(run) -> dict[int, float]:
    """Step -> the run's measured iteration ms (``metrics.jsonl``; ConfigError naming the record)."""
    out = {}
    for i, row in enumerate(run.metrics):
        if "iteration_time_ms" not in row or "step" not in row:
            continue
        try:
            out[int(row["step"])] = float(row["iteration_time_ms"])
        except (TypeError, ValueError):
            raise ConfigError(
                f"--from-trace {run.folder}/metrics.jsonl: record {i}: 'step' {row['step']!r} or "
                f"'iteration_time_ms' {row['iteration_time_ms']!r} is not a number"
            ) from None
    return out


def measured_step_ends(run) -> list[float]:
    """Per kept traced step of ``run`` (a ``trace_fit.TracedRun``) that ``metrics.jsonl`` times: its iteration ms less its traced span (first
    action's start to last action's end, every rank) less what the simulator's DP gradient all-reduce
    adds past the ranks' last actions (``max over ranks (last end + all-reduce) - max last end``)."""
    layout = run.plan.layout
    costs = PlanCosts(layout, run.base, run.plan.samples)
    allreduce = [costs.allreduce_ms(r) for r in range(layout.ranks_per_replica)]
    iteration = _iteration_ms(run)
    by_step: dict[int, list[dict]] = defaultdict(list)
    for e in run.events:
        by_step[e["args"]["step"]].append(e)
    out = []
    for step, evs in sorted(by_step.items()):
        if step not in iteration:
            continue
        last: dict[int, float] = defaultdict(float)
        for e in evs:
            last[e["pid"]] = max(last[e["pid"]], (e["ts"] + e["dur"]) / 1e3)
        end, start = max(last.values()), min(e["ts"] for e in evs) / 1e3
        priced = max(t + allreduce[layout.replica_of(pid // run.tp)[1]] for pid, t in last.items()) - end
        out.append(iteration[step] - (end - start) - priced)
    return out


def fit_step_end(runs: list, base: HardwareSpec) -> tuple[float, float, dict]:
    """``(step_end_ms, step_end_ms_per_param_byte, notes)`` from ``runs`` (module docstring); the
    base's terms and no notes where no run's metrics time a traced step."""
    points = []
    for run in runs:
        ms = measured_step_ends(run)
        if ms:
            costs = PlanCosts(run.plan.layout, run.base, run.plan.samples)
            points.append(
                (max(rank_param_bytes(run.plan.layout, costs.stage_quads)), statistics.median(ms), len(ms))
            )
    if not points:
        return base.step_end_ms, base.step_end_ms_per_param_byte, {}
    x = np.array([p[0] for p in points])
    y = np.array([p[1] for p in points])
    per_byte = base.step_end_ms_per_param_byte
    alike = len(points) < 2 or float(x.std()) <= BYTES_SPREAD_MIN * abs(float(x.mean()))
    if alike:
        constant = float(np.mean(y - per_byte * x))
    else:
        per_byte, constant = (
            float(v) for v in np.linalg.lstsq(np.column_stack([x, np.ones_like(x)]), y, rcond=None)[0]
        )
        if constant < 0:
            per_byte, constant = max(0.0, float(x @ y / (x @ x))), 0.0
        elif per_byte < 0:
            per_byte, constant = 0.0, float(y.mean())
    constant = max(0.0, constant)
    notes = {
        "ms": constant,
        "ms_per_param_byte": per_byte,
        "slope_fitted": not alike,
        "runs": [{"param_bytes": b, "median_ms": m, "steps": n} for b, m, n in points],
    }
    return constant, per_byte, notes
