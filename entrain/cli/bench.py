"""``entrain bench paper``: reproduce the paper's evaluation in simulation and write
``benchmarks/results/paper_reproduction.md`` (+ ``.json``) with our numbers beside the paper's.

Setup (paper §7.1): 64 GPUs = DP 4 x 16, TP 2, global batch 512, microbatch 4 (K = 32), the four
datasets x {Llama3-1B, Llama3-3B}, every system with the configuration its own method picks
(``entrain.sim.systems``), under both hardware presets. Also: the Fig. 14 encoder:LLM stage-split
sweep (Entrain under every E.PP:L.PP with E.PP + L.PP = 8), Algorithm 1's trials at 1, 4, 16, 64,
256 (Tables 2, 5-11), per-microbatch forward-time std (Table 3), peak activation memory (Fig. 13)
and Entrain's gap to ``ideal_ms`` split into partition granularity, microbatch residual and
communication. ``--quick``: one case (SynthChartNet + Llama3-1B, a40-paper), two iterations.

This module runs the cases; ``entrain.cli.bench_report`` computes the targets and the report's
facts; the paper's values are package data (``entrain/cli/paper/figures.json``) and the report's
wording a template (``entrain/cli/paper/report.md.j2``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

from entrain.cli.bench_report import PAPER, SHORT, render, targets
from entrain.cli.common import add_shared_flags, emit_json
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.planning.config_search import evaluate_config
from entrain.core.planning.setups import ConfigRequest, entrain_variant, system_setups
from entrain.core.systems import ENTRAIN
from entrain.core.systems import SYSTEMS as REGISTRY
from entrain.data.sampling import dataset_sampler
from entrain.sim.ablation import ABLATED, dip_greedy_ablation
from entrain.sim.choose import candidate_judge
from entrain.sim.executor import simulate_plan
from entrain.sim.run import run_system

DATASETS = ("synthchartnet", "chartqa", "cocoqa", "llava150k")
MODELS = ("qwen25vl-llama3-1b", "qwen25vl-llama3-3b")
HARDWARE = ("a40-paper", "a40-flops")
SYSTEMS = tuple(REGISTRY)
TRIAL_SIZES = (1, 4, 16, 64, 256)
GPUS, DP, TP, GLOBAL_BATCH, MICROBATCH = 64, 4, 2, 512, 4
VARIANTS = {
    PAPER: ("disjoint", 0, False),
    "entrain+ramp": ("disjoint", "auto", False),
    "entrain+shared": ("auto", 0, False),
    "entrain+split": ("disjoint", 0, True),
}
"""Entrain as the paper (Algorithm 2's disjoint E.PP:L.PP stages, no ramp, whole backwards) and one
ablation row per extension of ours: (entrain_layout, entrain_ramp, entrain_split)."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmarks (paper reproduction in simulation)", description=__doc__
    )
    sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    paper = sub.add_parser("paper", help="reproduce the paper's evaluation (Fig. 11, 13, 14, Tables 1-3)",
                           description=__doc__)  # fmt: skip
    paper.add_argument("--out", default="benchmarks/results/paper_reproduction.md",
                       help="markdown report; the numbers also go to the same path with .json")  # fmt: skip
    paper.add_argument("--quick", action="store_true", help="one case, two iterations (< 30 s)")
    add_shared_flags(paper, "bench paper", "iterations")
    paper.add_argument("--sweep-iterations", type=int, default=5, help="iterations per Fig. 14 sweep point")
    add_shared_flags(paper, "bench paper", "seed")
    add_shared_flags(paper, "bench paper", "jobs")
    add_shared_flags(paper, "bench paper", "json")
    paper.set_defaults(func=run)


# --- running -------------------------------------------------------------------------------------------
def _split(layout) -> str:
    c = layout.components
    return f"{c['encoder'].pp}:{c['llm'].pp}"


def _setups(req: ConfigRequest, cost, systems) -> dict:
    """Every system's setup, Entrain's variants and our default Entrain (``entrain``, ``entrain-1f1b``)."""
    sampler = dataset_sampler(req.dataset, req.seed)
    judge = candidate_judge(sampler, cost, req)
    setups = system_setups(list(systems), req, cost, sampler, judge)
    base = setups[ENTRAIN]
    for name, (lay, ramp, split) in VARIANTS.items():
        variant = replace(req, entrain_layout=lay, entrain_ramp=ramp, entrain_split=split)
        setups[name] = entrain_variant(base, variant, cost, judge)
    default = replace(
        req, entrain_layout="auto", entrain_ramp="auto", entrain_split=True, entrain_assignment="auto"
    )
    default = entrain_variant(base, default, cost, judge)
    setups.update({n: default for n in systems if REGISTRY[n].extensions})
    return setups


def _ramp_counts(chosen) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ramp, pieces in (c for it in chosen for c in it):
        key = f"{ramp}x{pieces}" if ramp else "0"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def _system_json(run, setup) -> dict:
    out = {**run.metrics.to_json(), "split": _split(setup.layout), "source": setup.source,
           "shared_boundary": len(setup.layout.stages) > setup.layout.ranks_per_replica}  # fmt: skip
    chosen = run.plan.options.get("ramp_chosen")
    if chosen:
        out["ramp_chosen_counts"] = _ramp_counts(chosen)
    return out


def run_case(dataset: str, model: str, hardware: str, *, iterations: int, seed: int, sweep_iterations: int,
             sweep: bool, systems=SYSTEMS) -> dict:  # fmt: skip
    from entrain.core.costs.presets import resolve_cost_model
    from entrain.data.workload_io import load_workload

    t0 = time.perf_counter()
    cost = resolve_cost_model(model, hardware=hardware)
    batches = list(
        load_workload(dataset, cost, global_batch=GLOBAL_BATCH, iterations=iterations, seed=seed, tp=TP)
    )
    req = ConfigRequest(dataset, model, GPUS, DP, TP, GLOBAL_BATCH, MICROBATCH, seed, TRIAL_SIZES,
                        entrain_layout="disjoint", entrain_ramp=0, entrain_split=False,
                        entrain_assignment="paper")  # fmt: skip
    setups = _setups(req, cost, systems)
    runs = {}
    for name in (*systems, *VARIANTS):
        gen = name if name in systems else ENTRAIN
        s = setups[name]
        runs[name] = run_system(gen, s.layout, batches, cost, s.options, trace_iterations=0)
    ref = runs[ENTRAIN].metrics.iteration_time_ms
    out: dict = {"dataset": dataset, "model": model, "hardware": hardware, "iterations": iterations,
                 "systems": {n: {**_system_json(r, setups[n]), "entrain_speedup": r.metrics.iteration_time_ms / ref}
                             for n, r in runs.items()}}  # fmt: skip
    if all(n in runs for n in ABLATED):
        steps = dip_greedy_ablation(runs, batches, cost)
        out["dip_greedy_ablation"] = {k: _ablation_json(r) for k, r in steps.items()}
    b_min = setups[PAPER].b_min_result
    out.update(b_min=b_min.b_min, b_min_converged=b_min.converged, b_min_reason=b_min.reason,
               trials=[t.to_json() for t in b_min.trials], gap=_gap(runs[ENTRAIN], cost),
               gap_paper=_gap(runs[PAPER], cost))  # fmt: skip
    if sweep:
        out["sweep"] = _sweep(setups[PAPER].profile, cost, batches[:sweep_iterations])
    out["wall_s"] = time.perf_counter() - t0
    return out


def _ablation_json(run) -> dict:
    m = run.metrics
    peak = max(m.peak_memory_bytes_per_rank or [0.0])
    return {"iteration_time_ms": m.iteration_time_ms, "fits_memory": m.fits_memory, "peak_memory_bytes": peak}


def _gap(run, cost) -> dict:
    """Entrain's gap to ideal_ms: partition granularity, microbatch residual, communication."""
    free = simulate_plan(run.plan, cost, comm=False, trace_iterations=0)
    compute_only = sum(max(r.makespan_ms for r in it.replicas) for it in free) / len(free)
    m = run.metrics
    return {
        "ideal_ms": m.ideal_ms,
        "partition_ideal_ms": m.partition_ideal_ms,
        "compute_only_ms": compute_only,
        "iteration_time_ms": m.iteration_time_ms,
        "partition_granularity_ms": m.partition_ideal_ms - m.ideal_ms,
        "microbatch_residual_ms": compute_only - m.partition_ideal_ms,
        "communication_ms": m.iteration_time_ms - compute_only,
    }


def _sweep(profile, cost, batches) -> dict:
    """Entrain's iteration time under every E.PP:L.PP split of the 8 stage slots (Fig. 14)."""
    out = {}
    for e in range(1, 8):
        key = f"{e}:{8 - e}"
        try:
            parallel = ParallelConfig(dp=DP, tp=TP, global_batch=GLOBAL_BATCH, microbatch_size=MICROBATCH)
            cfg = evaluate_config(profile, cost, parallel, encoder=(TP, 1, e), llm=(TP, 1, 8 - e))
        except ConfigError:
            out[key] = None
            continue
        run = run_system(ENTRAIN, cfg.to_layout(), batches, cost, trace_iterations=0)
        out[key] = {"iteration_time_ms": run.metrics.iteration_time_ms, "memory_ok": cfg.memory_ok,
                    "eq2_ms": cfg.predicted_iteration_time_ms}  # fmt: skip
    return out


def bench_paper(
    *, quick: bool, iterations: int, sweep_iterations: int, seed: int, jobs: int = 1, log=print
) -> dict:
    """Run every case (``jobs`` worker processes; each case is independent and deterministic)."""
    t0 = time.perf_counter()
    if quick:
        plan = [("synthchartnet", MODELS[0], "a40-paper")]
        iterations, sweep_iterations = 2, 2
    else:
        # slowest cases first so the workers finish together
        plan = [(d, m, h) for h in HARDWARE for m in reversed(MODELS) for d in reversed(DATASETS)]
    kwargs = [dict(dataset=d, model=m, hardware=h, iterations=iterations, seed=seed,
                   sweep_iterations=sweep_iterations, sweep=h == "a40-paper") for d, m, h in plan]  # fmt: skip
    cases: list[dict] = []
    if jobs <= 1 or len(plan) == 1:
        for kw in kwargs:
            cases.append(_logged(run_case_kw(kw), log))
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_case_kw, kw) for kw in kwargs]
            for fut in as_completed(futures):
                cases.append(_logged(fut.result(), log))
    order = {
        (d, m, h): i
        for i, (d, m, h) in enumerate((d, m, h) for h in HARDWARE for m in MODELS for d in DATASETS)
    }
    cases.sort(key=lambda c: order.get((c["dataset"], c["model"], c["hardware"]), 0))
    return {"quick": quick, "iterations": iterations, "sweep_iterations": sweep_iterations, "seed": seed,
            "jobs": jobs, "setup": {"gpus": GPUS, "dp": DP, "tp": TP, "global_batch": GLOBAL_BATCH,
                                    "microbatch_size": MICROBATCH},
            "cases": cases, "targets": targets(cases), "wall_s": time.perf_counter() - t0}  # fmt: skip


def run_case_kw(kw: dict) -> dict:
    kw = dict(kw)
    return run_case(kw.pop("dataset"), kw.pop("model"), kw.pop("hardware"), **kw)


def _logged(case: dict, log) -> dict:
    log(f"bench paper: {case['dataset']} + {SHORT[case['model']]} on {case['hardware']}: entrain "
        f"{case['systems'][ENTRAIN]['iteration_time_ms'] / 1e3:.2f} s ({case['wall_s']:.0f} s wall)")  # fmt: skip
    return case


def _numbers_path(out: str) -> str:
    """The JSON beside the report ``out`` (its numbers), probed as ``--out`` is, before any work."""
    from entrain.cli.argtypes import output_file

    path = os.path.splitext(out)[0] + ".json"
    if os.path.abspath(path) == os.path.abspath(out):
        raise ConfigError(f"--out {out}: the numbers go to {path}; give the report another extension (.md)")
    try:
        return output_file(path)
    except argparse.ArgumentTypeError as e:
        raise ConfigError(f"--out {out}: its numbers' file: {e}") from None


def run(args: argparse.Namespace) -> int:
    json_path = _numbers_path(args.out)
    res = bench_paper(quick=args.quick, iterations=args.iterations, sweep_iterations=args.sweep_iterations,
                      seed=args.seed, jobs=args.jobs, log=lambda m: print(m, file=sys.stderr, flush=True))  # fmt: skip
    text = render(res)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    with open(json_path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"entrain bench paper: wrote {args.out} and {json_path}", file=sys.stderr)
    if args.json:
        emit_json(res)
        return 0
    for t in res["targets"]:
        print(f"{'MET ' if t['met'] else 'MISS'}  {t['target']:<45} {t['case']:<40} {t['value']}")
    return 0
