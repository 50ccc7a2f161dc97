"""``entrain assign``: run each system's batcher on the workload and report how evenly it spreads
encoder and LLM work over microbatches (CONTRACT.md ``entrain assign``).

Default systems: ``entrain,1f1b,disttrain,dip`` (one per distinct batcher; ``entrain-1f1b``,
``disttrain-paper`` and ``dip-greedy`` share those batchers and can be named explicitly).
``disttrain``'s reordering sees two stages (the microbatch's summed encoder and LLM work) here;
the simulator passes the real per-stage times of its layout.

Summary statistics, per CONTRACT.md: for each (iteration, replica) the population std and the
max/mean of the per-microbatch encoder work (over encoder microbatches) and LLM work (over LLM
microbatches); then the mean over all (iteration, replica). Units: ms (or the raw-work file's).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from entrain.cli.common import add_common_args, emit_json, model_label, resolve_cost_model, workload_source
from entrain.config import RunConfig
from entrain.core.assignment.types import IterationAssignment
from entrain.core.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.parallel import num_microbatches
from entrain.core.systems import ENTRAIN, default_systems, get_system, parse_systems
from entrain.core.work import SampleWork

DEFAULT_SYSTEMS = default_systems("assign")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "assign",
        help="per-iteration microbatch assignment of each system, with balance statistics",
        description=__doc__.split("\n\n")[0],
    )
    add_common_args(p, "assign", systems_default=DEFAULT_SYSTEMS)
    p.set_defaults(func=run)


def _ratio(x: np.ndarray) -> float:
    mean = float(x.mean())
    return float(x.max() / mean) if mean > 0 else 1.0


def summarize(iterations: Sequence[IterationAssignment]) -> dict[str, float]:
    """CONTRACT.md summary (four keys) plus ``k_eff_mean`` and ``deferrals_per_iteration``."""
    rows = []
    for it in iterations:
        for r in it.replicas:
            enc, llm = np.array(r.encoder_work), np.array(r.llm_work)
            rows.append((enc.std(), llm.std(), _ratio(llm), _ratio(enc), r.k_eff))
    m = np.array(rows).mean(axis=0) if rows else np.zeros(5)
    deferrals = sum(len(r.deferrals) for it in iterations for r in it.replicas)
    return {
        "encoder_work_std": float(m[0]),
        "llm_work_std": float(m[1]),
        "llm_max_over_mean": float(m[2]),
        "encoder_max_over_mean": float(m[3]),
        "k_eff_mean": float(m[4]),
        "deferrals_per_iteration": deferrals / max(1, len(iterations)),
    }


def resolve_dp(args: argparse.Namespace, first_batch: Sequence[SampleWork], cost: CostModel) -> int:
    """``--dp``, or the DP of the planner's configuration (Algorithm 2, ``search_config``) profiled
    on the first iteration's global batch, on ``--gpus`` GPUs (noted on stderr)."""
    if args.dp is not None:
        if args.dp < 1:
            raise ConfigError(f"--dp must be >= 1, got {args.dp}")
        return args.dp
    from entrain.core.planner import search_config

    cfg = search_config(first_batch, cost, gpus=args.gpus, dp=None, tp=args.tp, cp=1,
                        global_batch=args.global_batch, microbatch_size=args.microbatch_size)  # fmt: skip
    print(
        f"entrain assign: --dp not given; the planner chose dp={cfg.dp} for {args.gpus} GPUs", file=sys.stderr
    )
    return cfg.dp


def _table(results: dict[str, dict], times_ms: dict[str, float], head: str) -> str:
    base = results.get(ENTRAIN, {}).get("summary")
    lines = [head, ""]
    cols = f"{'system':<16}{'enc std':>10}{'llm std':>10}{'enc max/mean':>14}{'llm max/mean':>14}"
    cols += f"{'K_eff':>7}{'defer/it':>10}{'ms/iter':>9}"
    if base:
        cols += f"{'enc std vs entrain':>20}{'llm std vs entrain':>20}"
    lines += [cols, "-" * len(cols)]
    for name, res in results.items():
        s = res["summary"]
        row = f"{name:<16}{s['encoder_work_std']:>10.2f}{s['llm_work_std']:>10.2f}"
        row += f"{s['encoder_max_over_mean']:>14.3f}{s['llm_max_over_mean']:>14.3f}"
        row += f"{s['k_eff_mean']:>7.1f}{s['deferrals_per_iteration']:>10.1f}{times_ms[name]:>9.1f}"
        if base:
            for key in ("encoder_work_std", "llm_work_std"):
                ratio = s[key] / base[key] if base[key] > 0 else float("inf") if s[key] > 0 else 1.0
                row += f"{ratio:>19.2f}x"
        lines.append(row)
    lines += ["", "std and max/mean: per (iteration, replica) across microbatches, then averaged; "
              "work = forward+backward ms per microbatch"]  # fmt: skip
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    systems = parse_systems(args.systems)
    RunConfig.from_args(args)  # the flags' rules (batch divisibility, degrees), before any work
    cost = resolve_cost_model(args)
    batches = list(workload_source(args, cost).batches(args.global_batch, args.iterations))
    dp = resolve_dp(args, batches[0], cost)
    k = num_microbatches(args.global_batch, dp, args.microbatch_size)
    results: dict[str, dict] = {}
    times_ms: dict[str, float] = {}
    for name in systems:
        batcher = get_system(name).batcher
        t0 = time.perf_counter()
        its = [batcher(b, dp, k) for b in batches]
        times_ms[name] = (time.perf_counter() - t0) * 1e3 / max(1, len(batches))
        results[name] = {"summary": summarize(its), "iterations": [it.to_json() for it in its]}
    if args.json:
        emit_json({
            "systems": results, "dataset": args.dataset, "model": model_label(args), "dp": dp,
            "global_batch": args.global_batch, "microbatch_size": args.microbatch_size,
            "num_microbatches": k, "iterations": args.iterations, "seed": args.seed,
        })  # fmt: skip
        return 0
    head = (f"entrain assign: dataset {args.dataset}, model {model_label(args)}, dp {dp}, global batch "
            f"{args.global_batch}, microbatch size {args.microbatch_size} (K = {k}), {args.iterations} iterations")  # fmt: skip
    print(_table(results, times_ms, head))
    return 0
