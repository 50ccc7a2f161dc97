"""``entrain assign``: run each system's batcher on the workload and report how evenly it spreads
encoder and LLM work over microbatches (docs/contract.md ``entrain assign``).

Default systems: ``entrain,1f1b,disttrain,dip`` (one per distinct batcher; ``entrain-1f1b``,
``disttrain-paper`` and ``dip-greedy`` share those batchers and can be named explicitly).
``disttrain``'s reordering sees two stages (the microbatch's summed encoder and LLM work) here;
the simulator passes the real per-stage times of its layout.

Summary statistics, per docs/contract.md: for each (iteration, replica) the population std and the
max/mean of the per-microbatch encoder work (over encoder microbatches) and LLM work (over LLM
microbatches); then the mean over all (iteration, replica). Units: ms (or the raw-work file's).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from entrain.cli.common import add_common_args, config_workload, emit_json
from entrain.config import RunConfig
from entrain.core.costs.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.ir.microbatches import IterationAssignment
from entrain.core.ir.parallel import ParallelConfig, num_microbatches
from entrain.core.systems import ENTRAIN, default_systems, get_system
from entrain.core.workload.work import SampleWork

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
    """docs/contract.md's summary (four keys) plus ``k_eff_mean`` and ``deferrals_per_iteration``."""
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


def resolve_dp(config: RunConfig, first_batch: Sequence[SampleWork], cost: CostModel) -> int:
    """``--dp``, or the DP of the planner's configuration (Algorithm 2, ``search_config``) profiled
    on the first iteration's global batch, on ``--gpus`` GPUs (noted on stderr)."""
    par = config.parallel
    if par.dp is not None:
        if par.dp < 1:
            raise ConfigError(f"--dp must be >= 1, got {par.dp}")
        return par.dp
    from entrain.core.planning.config_search import search_config

    parallel = ParallelConfig(
        gpus=par.gpus, tp=par.tp, global_batch=par.global_batch, microbatch_size=par.microbatch_size
    )
    cfg = search_config(first_batch, cost, parallel)
    print(
        f"entrain assign: --dp not given; the planner chose dp={cfg.dp} for {par.gpus} GPUs", file=sys.stderr
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


@dataclass(frozen=True)
class AssignRequest:
    """What ``entrain assign`` does: the run's configuration and its own flags (read once, in ``run``)."""

    config: RunConfig
    iterations: int
    json: bool


def run(args: argparse.Namespace) -> int:
    return assign(AssignRequest(RunConfig.from_args(args), args.iterations, args.json))


def assign(req: AssignRequest) -> int:
    """Every system's assignment of the workload's iterations, as a table or ``--json``."""
    config, par = req.config, req.config.parallel
    cost = config.model.cost_model()
    batches = list(config_workload(config, cost).batches(par.global_batch, req.iterations))
    dp = resolve_dp(config, batches[0], cost)
    k = num_microbatches(par.global_batch, dp, par.microbatch_size)
    results: dict[str, dict] = {}
    times_ms: dict[str, float] = {}
    for name in config.schedule.systems:
        batcher = get_system(name).batcher
        t0 = time.perf_counter()
        its = [batcher(b, dp, k) for b in batches]
        times_ms[name] = (time.perf_counter() - t0) * 1e3 / max(1, len(batches))
        results[name] = {"summary": summarize(its), "iterations": [it.to_json() for it in its]}
    data, model = config.data.dataset, config.model.arch().name
    if req.json:
        emit_json({
            "systems": results, "dataset": data, "model": model, "dp": dp,
            "global_batch": par.global_batch, "microbatch_size": par.microbatch_size,
            "num_microbatches": k, "iterations": req.iterations, "seed": config.data.seed,
        })  # fmt: skip
        return 0
    head = (f"entrain assign: dataset {data}, model {model}, dp {dp}, global batch "
            f"{par.global_batch}, microbatch size {par.microbatch_size} (K = {k}), {req.iterations} iterations")  # fmt: skip
    print(_table(results, times_ms, head))
    return 0
