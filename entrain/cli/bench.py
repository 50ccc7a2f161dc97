"""``entrain bench paper``: reproduce the paper's evaluation in simulation and write
``benchmarks/results/paper_reproduction.md`` (+ ``.json``) with our numbers beside the paper's.

Setup (paper §7.1): 64 GPUs = DP 4 x 16, TP 2, global batch 512, microbatch 4 (K = 32), the four
datasets x {Llama3-1B, Llama3-3B}, every system with the configuration its own method picks
(``entrain.sim.systems``), under both hardware presets. Also: the Fig. 14 encoder:LLM stage-split
sweep (Entrain under every E.PP:L.PP with E.PP + L.PP = 8), Algorithm 1's trials at 1, 4, 16, 64,
256 (Tables 2, 5-11), per-microbatch forward-time std (Table 3), peak activation memory (Fig. 13)
and Entrain's gap to ``ideal_ms`` split into partition granularity, microbatch residual and
communication. ``--quick``: one case (SynthChartNet + Llama3-1B, a40-paper), two iterations.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

from entrain.cli.common import emit_json
from entrain.core.errors import ConfigError
from entrain.core.planner import PAPER_TABLE1, evaluate_config
from entrain.sim.executor import simulate_plan
from entrain.sim.run import run_system
from entrain.sim.systems import ConfigRequest, entrain_variant, system_setups

DATASETS = ("synthchartnet", "chartqa", "cocoqa", "llava150k")
MODELS = ("qwen25vl-llama3-1b", "qwen25vl-llama3-3b")
HARDWARE = ("a40-paper", "a40-flops")
SYSTEMS = ("entrain", "entrain-1f1b", "1f1b", "disttrain", "disttrain-paper", "dip", "dip-greedy")
TRIAL_SIZES = (1, 4, 16, 64, 256)
GPUS, DP, TP, GLOBAL_BATCH, MICROBATCH = 64, 4, 2, 512, 4
SHORT = {"qwen25vl-llama3-1b": "1B", "qwen25vl-llama3-3b": "3B"}
BASELINES = ("1f1b", "disttrain", "disttrain-paper", "dip", "dip-greedy")
PAPER = "entrain-paper"
"""Entrain exactly as the paper: Algorithm 2's disjoint E.PP:L.PP stages, no ramp."""
RAMP = "entrain+ramp"
"""Ablation row: the paper's layout with ``ramp_microbatches = "auto"`` (our extension only)."""
SHARED = "entrain+shared"
"""Ablation row: the boundary-sharing layout where Eq. 2 prefers it (our extension only), no ramp."""
VARIANTS = {PAPER: ("disjoint", 0), RAMP: ("disjoint", "auto"), SHARED: ("auto", 0)}
ENTRAINS = ("entrain", PAPER)
"""``entrain`` = our default (both extensions, each where the cost model predicts a gain)."""

# --- the paper's numbers (reference/entrain-paper.md; [R] = read off a plot) ---------------------------
PAPER_FIG11_S = {  # (DistTrain, DIP, Entrain) iteration time in s [R]
    ("synthchartnet", "1B"): (19.2, 20.1, 14.2), ("chartqa", "1B"): (15.3, 16.5, 12.3),
    ("cocoqa", "1B"): (8.4, 8.6, 7.9), ("llava150k", "1B"): (9.1, 9.1, 8.1),
    ("synthchartnet", "3B"): (25.6, 24.8, 19.0), ("chartqa", "3B"): (19.2, 20.8, 17.9),
    ("cocoqa", "3B"): (10.8, 11.1, 9.0), ("llava150k", "3B"): (13.2, 12.9, 10.9),
}  # fmt: skip
PAPER_TABLE3_MS = {  # (vision, LLM) forward-time std; DistTrain / DIP / Entrain [Q]
    ("synthchartnet", "1B"): {"disttrain": (208.07, 77.92), "dip": (102.13, 37.45), "entrain": (19.60, 18.79)},
    ("chartqa", "1B"): {"disttrain": (61.34, None), "dip": (73.42, None), "entrain": (15.23, None)},
    ("cocoqa", "1B"): {"disttrain": (22.82, None), "dip": (28.79, None), "entrain": (22.11, None)},
    ("llava150k", "1B"): {"disttrain": (17.98, None), "dip": (14.82, None), "entrain": (8.11, None)},
    ("synthchartnet", "3B"): {"disttrain": (208.07, 164.55), "dip": (102.13, 84.36), "entrain": (19.60, 40.24)},
    ("chartqa", "3B"): {"disttrain": (61.34, 35.44), "dip": (73.42, 40.56), "entrain": (15.23, 25.72)},
    ("cocoqa", "3B"): {"disttrain": (22.82, 5.37), "dip": (28.79, 7.77), "entrain": (22.11, 5.52)},
    ("llava150k", "3B"): {"disttrain": (17.98, 32.92), "dip": (14.82, 33.27), "entrain": (8.11, 31.66)},
}  # fmt: skip
PAPER_TRIALS = {  # Tables 2, 5-11: GPU splits (vision:LLM) seen per profiling size; * = stable [Q]
    ("synthchartnet", "3B"): ["10:6 9:7 8:8 7:9 6:10", "9:7 8:8 7:9", "9:7 8:8 7:9", "8:8*", "8:8*"],
    ("synthchartnet", "1B"): ["11:5 10:6 9:7", "11:5 10:6 9:7", "11:5 10:6", "10:6*", "10:6*"],
    ("llava150k", "1B"): ["10:6 9:7 8:8", "10:6 9:7 8:8", "9:7 8:8", "9:7*", "9:7*"],
    ("chartqa", "1B"): ["10:6 9:7", "10:6 9:7", "10:6*", "10:6*", "10:6*"],
    ("cocoqa", "1B"): ["10:6 9:7", "10:6 9:7", "10:6*", "10:6*", "10:6*"],
    ("llava150k", "3B"): ["7:9 6:10 5:11", "7:9 6:10", "7:9 6:10", "7:9 6:10", "7:9*"],
    ("chartqa", "3B"): ["8:8 7:9", "8:8*", "8:8*", "8:8*", "8:8*"],
    ("cocoqa", "3B"): ["8:8 7:9", "8:8*", "8:8*", "8:8*", "8:8*"],
}  # fmt: skip
PAPER_FIG14 = {  # iteration time relative to the profiled config (chosen = 1.00) [Q]
    ("synthchartnet", "1B"): {"7:1": 1.66, "6:2": 1.16, "5:3": 1.0, "4:4": 1.04, "3:5": 1.18},
    ("synthchartnet", "3B"): {"5:3": 1.26, "4:4": 1.0, "3:5": 1.07, "2:6": 1.16, "1:7": 1.85},
    ("llava150k", "1B"): {"6:2": 1.27, "5:3": 1.09, "4:4": 1.0, "3:5": 1.10, "2:6": 1.27},
    ("llava150k", "3B"): {"5:3": 1.35, "4:4": 1.14, "3:5": 1.0, "2:6": 1.02, "1:7": 1.53},
    ("chartqa", "1B"): {"7:1": 1.66, "6:2": 1.17, "5:3": 1.0, "4:4": 0.96},
    ("chartqa", "3B"): {"5:3": 1.17, "4:4": 1.0, "3:5": 0.94, "2:6": 1.07, "1:7": 1.62},
    ("cocoqa", "1B"): {"7:1": 1.50, "6:2": 1.07, "5:3": 1.0, "4:4": 1.03, "3:5": 1.16},
    ("cocoqa", "3B"): {"5:3": 1.14, "4:4": 1.04, "3:5": 1.0, "2:6": 1.13, "1:7": 1.76},
}  # fmt: skip


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
    paper.add_argument("--iterations", type=int, default=20)
    paper.add_argument("--sweep-iterations", type=int, default=5, help="iterations per Fig. 14 sweep point")
    paper.add_argument("--seed", type=int, default=0)
    paper.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                       help="worker processes (default: 2 or the CPU count if lower)")  # fmt: skip
    paper.add_argument(
        "--json", action="store_true", help="also print the numbers as one JSON object on stdout"
    )
    paper.set_defaults(func=run)


# --- running -------------------------------------------------------------------------------------------
def _split(layout) -> str:
    c = layout.components
    return f"{c['encoder'].pp}:{c['llm'].pp}"


def run_case(dataset: str, model: str, hardware: str, *, iterations: int, seed: int, sweep_iterations: int,
             sweep: bool, systems=SYSTEMS) -> dict:  # fmt: skip
    from entrain.core.presets import build_cost_model
    from entrain.data.workload_io import load_workload

    t0 = time.perf_counter()
    cost = build_cost_model(model, hardware)
    batches = list(
        load_workload(dataset, cost, global_batch=GLOBAL_BATCH, iterations=iterations, seed=seed, tp=TP)
    )
    req = ConfigRequest(dataset, model, GPUS, DP, TP, GLOBAL_BATCH, MICROBATCH, seed, TRIAL_SIZES,
                        entrain_layout="disjoint", entrain_ramp=0)  # fmt: skip
    setups = system_setups(list(systems), req, cost, batches)  # the paper's Entrain and the baselines
    base = setups["entrain"]
    setups[PAPER] = base
    for name, (lay, ramp) in VARIANTS.items():
        setups[name] = entrain_variant(base, replace(req, entrain_layout=lay, entrain_ramp=ramp), cost)
    default = entrain_variant(base, replace(req, entrain_layout="auto", entrain_ramp="auto"), cost)
    setups.update({n: default for n in ("entrain", "entrain-1f1b") if n in systems})
    out: dict = {
        "dataset": dataset,
        "model": model,
        "hardware": hardware,
        "iterations": iterations,
        "systems": {},
    }
    runs = {}
    for name in (*systems, *VARIANTS):
        s = setups[name]
        gen = name if name in systems else "entrain"
        runs[name] = run_system(gen, s.layout, batches, cost, s.options, trace_iterations=0)
        out["systems"][name] = {**runs[name].metrics.to_json(), "split": _split(s.layout), "source": s.source,
                                "shared_boundary": len(s.layout.stages) > s.layout.ranks_per_replica}  # fmt: skip
        chosen = runs[name].plan.options.get("ramp_chosen")
        if chosen:
            counts: dict[str, int] = {}
            for ramp, pieces in (c for it in chosen for c in it):
                key = f"{ramp}x{pieces}" if ramp else "0"
                counts[key] = counts.get(key, 0) + 1
            out["systems"][name]["ramp_chosen_counts"] = dict(sorted(counts.items()))
    ref = runs["entrain"].metrics.iteration_time_ms
    for name, r in runs.items():
        out["systems"][name]["entrain_speedup"] = r.metrics.iteration_time_ms / ref
    out["b_min"] = base.b_min
    out["trials"] = [t.to_json() for t in base.b_min_result.trials]
    out["gap"] = _gap(runs["entrain"], cost)
    out["gap_paper"] = _gap(runs[PAPER], cost)
    ent = base
    if sweep:
        out["sweep"] = _sweep(ent.profile, cost, batches[:sweep_iterations])
    out["wall_s"] = time.perf_counter() - t0
    return out


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
            cfg = evaluate_config(profile, cost, dp=DP, encoder=(TP, 1, e), llm=(TP, 1, 8 - e),
                                  global_batch=GLOBAL_BATCH, microbatch_size=MICROBATCH)  # fmt: skip
        except ConfigError:
            out[key] = None
            continue
        run = run_system("entrain", cfg.to_layout(), batches, cost, trace_iterations=0)
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
        f"{case['systems']['entrain']['iteration_time_ms'] / 1e3:.2f} s ({case['wall_s']:.0f} s wall)")  # fmt: skip
    return case


# --- targets -------------------------------------------------------------------------------------------
def _best_dip(case: dict) -> tuple[str, float]:
    dips = {n: case["systems"][n]["iteration_time_ms"] for n in ("dip", "dip-greedy") if n in case["systems"]}
    name = min(dips, key=dips.get)
    return name, dips[name]


def _oom_note(s: dict, names, mine: float) -> tuple[str, bool]:
    """(note on baselines faster than ``mine`` that do not fit device memory, met when those are
    excluded)."""
    faster = [n for n in names if n in s and s[n]["iteration_time_ms"] <= mine]
    oom = [n for n in faster if s[n].get("fits_memory") is False]
    note = "".join(
        f"; {n} is faster but needs {s[n]['peak_memory_bytes'] / 1e9:.0f} GB > "
        f"{s[n]['device_memory_bytes'] / 1e9:.0f} GB (OOM: not a valid win)"
        for n in oom
    )
    return note, len(faster) == len(oom)


def targets(cases: list[dict]) -> list[dict]:
    """Issue 3 requirement 7 for Entrain (our default, with the extensions) and Entrain as the paper
    (``entrain-paper``), on every case (both hardware presets). ``met`` compares iteration times
    only; a baseline that does not fit device memory is named in the value, and
    ``met_excluding_oom`` says whether the target holds without such invalid wins."""
    out = []
    for c in cases:
        tag = f"{c['dataset']} + {SHORT[c['model']]} ({c['hardware']})"
        s = c["systems"]
        for who in ENTRAINS:
            if who not in s:
                continue
            label = "Entrain" if who == "entrain" else "Entrain (paper: no extensions)"
            mine = s[who]["iteration_time_ms"]
            if s[who].get("fits_memory") is False:
                label += " [OOM]"
            closest = min((n for n in BASELINES if n in s), key=lambda n: s[n]["iteration_time_ms"])
            note, met_fit = _oom_note(s, BASELINES, mine)
            met = all(s[n]["iteration_time_ms"] > mine for n in BASELINES if n in s)
            out.append({"target": f"{label} faster than every baseline", "case": tag,
                        "value": f"closest: {closest} {s[closest]['iteration_time_ms'] / mine:.3f}x{note}",
                        "met": met, "met_excluding_oom": met_fit})  # fmt: skip
            out.append({"target": f"{label} within 10% of partition_ideal_ms", "case": tag,
                        "value": f"{mine / s[who]['partition_ideal_ms']:.3f}x",
                        "met": mine <= 1.10 * s[who]["partition_ideal_ms"]})  # fmt: skip
            if c["dataset"] == "synthchartnet" and c["model"] == MODELS[0]:
                dname, dtime = _best_dip(c)
                out.append({"target": f"{label} >= 1.35x vs disttrain", "case": tag,
                            "value": f"{s['disttrain']['iteration_time_ms'] / mine:.3f}x",
                            "met": s["disttrain"]["iteration_time_ms"] / mine >= 1.35})  # fmt: skip
                oom = s[dname].get("fits_memory") is False
                out.append({"target": f"{label} >= 1.41x vs the better DIP", "case": tag,
                            "value": f"{dtime / mine:.3f}x ({dname}" + (", OOM)" if oom else ")"),
                            "met": dtime / mine >= 1.41})  # fmt: skip
            if c["dataset"] == "synthchartnet":
                for key, need in (("encoder_fwd_std_ms", 10.0), ("llm_fwd_std_ms", 4.0)):
                    ratio = s["disttrain"][key] / max(s[who][key], 1e-9)
                    out.append({"target": f"{label} {key} >= {need:g}x below disttrain", "case": tag,
                                "value": f"{ratio:.1f}x", "met": ratio >= need})  # fmt: skip
    return out


# --- report --------------------------------------------------------------------------------------------
def _f(x, digits=2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def render(res: dict) -> str:
    cases = res["cases"]
    lines = [
        "# Paper reproduction (simulated)",
        "",
        f"Generated by `entrain bench paper{' --quick' if res['quick'] else ''}` in {res['wall_s']:.0f} s. "
        f"Setup as paper §7.1: {res['setup']['gpus']} GPUs (DP {DP}, TP {TP}, 8 pipeline ranks of 2 GPUs per replica), "
        f"global batch {GLOBAL_BATCH}, microbatch size {MICROBATCH} (K = 32), {res['iterations']} iterations per case, "
        f"seed {res['seed']}. Every system runs with the configuration its own method picks and the batcher and "
        "schedule of its own (DESIGN.md §2); every number comes from the same discrete-event simulator "
        "(`entrain.sim`). Paper values: `../shared/reference/entrain-paper.md` (figure values are read off plots).",
        "",
    ]
    lines += _targets_md(res["targets"])
    for hw in HARDWARE:
        hw_cases = [c for c in cases if c["hardware"] == hw]
        if hw_cases:
            lines += _fig11_md(hw, hw_cases)
    lines += _table1_md(cases)
    lines += _trials_md(cases)
    lines += _table3_md([c for c in cases if c["hardware"] == "a40-paper"])
    lines += _fig13_md([c for c in cases if c["hardware"] == "a40-paper"])
    lines += _fig14_md([c for c in cases if "sweep" in c])
    lines += _gap_md(cases)
    lines += _analysis_md(res)
    return "\n".join(lines) + "\n"


def _targets_md(rows: list[dict]) -> list[str]:
    out = ["## Targets (issue 3, requirement 7)", "",
           "`Entrain` = our default (boundary-sharing layout and ramped fill/drain, each only where the cost "
           "model predicts a gain); `Entrain (paper: no extensions)` = the paper's Entrain (`entrain-paper`). "
           "OOM = the configuration needs more than the A40's 48 GB (model state + peak activations): its "
           "time is shown, but a win by an OOM configuration is not a valid win (last column).", "",
           "| target | case | ours | met | met if OOM wins are excluded |", "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        fit = r.get("met_excluding_oom")
        fit_cell = "" if fit is None or fit == r["met"] else ("yes" if fit else "**no**")
        out.append(
            f"| {r['target']} | {r['case']} | {r['value']} | {'yes' if r['met'] else '**no**'} | {fit_cell} |"
        )
    return out + [""]


def _fig11_md(hw: str, cases: list[dict]) -> list[str]:
    names = [n for n in ("entrain", PAPER, RAMP, SHARED, *SYSTEMS[1:]) if n in cases[0]["systems"]]
    out = [f"## Fig. 11 — iteration time (s), hardware `{hw}`", "",
           "| case | " + " | ".join(names) + " | paper DistTrain / DIP / Entrain | paper speedup (best baseline) | "
           "ours: disttrain / best DIP vs Entrain |",
           "|---|" + "---|" * (len(names) + 3)]  # fmt: skip
    for c in cases:
        s = c["systems"]
        key = (c["dataset"], SHORT[c["model"]])
        p = PAPER_FIG11_S.get(key)
        ent = s["entrain"]["iteration_time_ms"]
        cells = [f"{s[n]['iteration_time_ms'] / 1e3:.2f}" + ("" if n == "entrain" else f" ({s[n]['entrain_speedup']:.2f}x)")
                 + (" **OOM**" if s[n].get("fits_memory") is False else "") for n in names]  # fmt: skip
        paper = f"{p[0]} / {p[1]} / {p[2]}" if p else "-"
        paper_sp = f"{min(p[0], p[1]) / p[2]:.2f}x" if p else "-"
        dname, dtime = _best_dip(c)
        ours = f"{s['disttrain']['iteration_time_ms'] / ent:.2f}x / {dtime / ent:.2f}x"
        out.append(
            f"| {c['dataset']} + {SHORT[c['model']]} | "
            + " | ".join(cells)
            + f" | {paper} | {paper_sp} | {ours} |"
        )
    return out + ["", "(x) = iteration time / Entrain's (our default: `entrain`). `entrain-paper` = the paper's "
                  "Entrain; `entrain+ramp` / `entrain+shared` = one extension each; `entrain-1f1b` = the default "
                  "without eager forward. **OOM** = model state + peak activations exceed the 48 GB A40 on some "
                  "rank (the simulator does not enforce memory; such a schedule could not run as simulated).", ""]  # fmt: skip


def _table1_md(cases: list[dict]) -> list[str]:
    out = ["## Table 1 — configurations (E.PP:L.PP, TP 2, DP 4)", "",
           "| case | hardware | entrain (ours / paper) | b_min | disttrain (ours / paper) | dip |",
           "|---|---|---|---|---|---|"]  # fmt: skip
    for c in cases:
        s = c["systems"]
        paper = PAPER_TABLE1.get((c["dataset"], c["model"]), {})
        pe = ":".join(map(str, paper.get("entrain", ()))) or "-"
        pd = ":".join(map(str, paper.get("disttrain", ()))) or "-"
        ent_ok = "same" if s[PAPER]["split"] == pe else "differs"
        out.append(f"| {c['dataset']} + {SHORT[c['model']]} | {c['hardware']} | {s[PAPER]['split']} / {pe} ({ent_ok}) | "
                   f"{c['b_min']} | {s['disttrain']['split']} / {pd} | {s['dip']['split']} colocated |")  # fmt: skip
    matches = {hw: sum(1 for c in cases if c["hardware"] == hw and
                       c["systems"][PAPER]["split"] == ":".join(map(str, PAPER_TABLE1.get((c["dataset"], c["model"]), {}).get("entrain", ()))))
               for hw in HARDWARE}  # fmt: skip
    totals = {hw: sum(1 for c in cases if c["hardware"] == hw) for hw in HARDWARE}
    out += ["", "Entrain's split equals paper Table 1 in " +
            ", ".join(f"{matches[h]}/{totals[h]} cases under `{h}`" for h in HARDWARE if totals[h]) + ".", ""]  # fmt: skip
    return out


def _trials_md(cases: list[dict]) -> list[str]:
    out = ["## Tables 2, 5–11 — Algorithm 1 trials (GPU split vision:LLM of 16 GPUs; * = all 59 draws agree)", "",
           "| case | hardware | " + " | ".join(f"b={b}" for b in TRIAL_SIZES) + " | b_min |",
           "|---|---|" + "---|" * (len(TRIAL_SIZES) + 1)]  # fmt: skip
    for c in cases:
        by = {t["batch_size"]: t for t in c["trials"]}
        cells = []
        for b in TRIAL_SIZES:
            t = by.get(b)
            cells.append(
                "-"
                if t is None
                else " ".join(f"{a}:{b}" for a, b in t["allocations_seen"]) + ("*" if t["stable"] else "")
            )
        out.append(
            f"| {c['dataset']} + {SHORT[c['model']]} | {c['hardware']} | "
            + " | ".join(cells)
            + f" | {c['b_min']} |"
        )
        paper = PAPER_TRIALS.get((c["dataset"], SHORT[c["model"]]))
        if paper and c["hardware"] == "a40-paper":
            out.append("| ↳ paper | | " + " | ".join(paper) + " | |")
    return out + [""]


def _table3_md(cases: list[dict]) -> list[str]:
    out = ["## Table 3 — std of per-microbatch forward time (ms), `a40-paper`", "",
           "| case | modality | disttrain (ours / paper) | dip (ours / paper) | entrain (ours / paper) | disttrain / entrain (ours / paper) |",
           "|---|---|---|---|---|---|"]  # fmt: skip
    for c in cases:
        s = c["systems"]
        paper = PAPER_TABLE3_MS.get((c["dataset"], SHORT[c["model"]]), {})
        for i, (key, label) in enumerate((("encoder_fwd_std_ms", "vision"), ("llm_fwd_std_ms", "LLM"))):
            cells = []
            for n in ("disttrain", "dip", "entrain"):
                pv = paper.get(n, (None, None))[i]
                cells.append(f"{s[n][key]:.1f} / {_f(pv)}")
            pr = paper.get("disttrain", (None, None))[i], paper.get("entrain", (None, None))[i]
            ratio_p = f"{pr[0] / pr[1]:.1f}x" if pr[0] and pr[1] else "-"
            ratio = s["disttrain"][key] / max(s["entrain"][key], 1e-9)
            out.append(
                f"| {c['dataset']} + {SHORT[c['model']]} | {label} | "
                + " | ".join(cells)
                + f" | {ratio:.1f}x / {ratio_p} |"
            )
    return out + [
        "",
        "Paper rows for Llama-1B on ChartQA/CocoQA/LLaVA duplicate the vision rows (a copy error in the paper) and are omitted.",
        "",
    ]


def _fig13_md(cases: list[dict]) -> list[str]:
    out = ["## Fig. 13 — peak activation memory per pipeline rank (GB), `a40-paper`", "",
           "| case | system | rank 0 … 7 | max |", "|---|---|---|---|"]  # fmt: skip
    for c in cases:
        for n in ("disttrain", "dip", "entrain", "entrain-1f1b"):
            s = c["systems"][n]
            ranks = " ".join(f"{b / 1e9:.1f}" for b in s["peak_activation_bytes_per_rank"])
            out.append(
                f"| {c['dataset']} + {SHORT[c['model']]} | {n} | {ranks} | {s['peak_activation_bytes'] / 1e9:.1f} |"
            )
    return out + ["", "Paper (SynthChartNet + 3B, rank 7, read off Fig. 13): DistTrain ≈ 8.5 GB, DIP ≈ 12–14 GB, Entrain ≈ 5.5 GB. "
                  "Ours counts activations only (no weights/optimizer state, no receive buffers).", ""]  # fmt: skip


def _fig14_md(cases: list[dict]) -> list[str]:
    if not cases:
        return []
    splits = [f"{e}:{8 - e}" for e in range(1, 8)]
    out = ["## Fig. 14 — Entrain under every encoder:LLM stage split (iteration time / chosen split's)", "",
           "| case | chosen | " + " | ".join(splits) + " | best split |", "|---|---|" + "---|" * (len(splits) + 1)]  # fmt: skip
    for c in cases:
        sw = c["sweep"]
        chosen = c["systems"][PAPER]["split"]
        base = (sw.get(chosen) or {}).get("iteration_time_ms")
        cells = []
        for k in splits:
            v = sw.get(k)
            cells.append(
                "-"
                if not v or not base
                else f"{v['iteration_time_ms'] / base:.2f}" + ("" if v["memory_ok"] else " (OOM)")
            )
        valid = {k: v["iteration_time_ms"] for k, v in sw.items() if v}
        best = min(valid, key=valid.get) if valid else "-"
        out.append(
            f"| {c['dataset']} + {SHORT[c['model']]} | {chosen} | " + " | ".join(cells) + f" | {best} |"
        )
        paper = PAPER_FIG14.get((c["dataset"], SHORT[c["model"]]))
        if paper:
            out.append("| ↳ paper | " + next(k for k, v in paper.items() if v == 1.0) + " | " +
                       " | ".join(_f(paper.get(k)) for k in splits) + " | |")  # fmt: skip
    return out + [""]


def _gap_md(cases: list[dict]) -> list[str]:
    out = ["## Entrain's gap to `ideal_ms` (s)", "",
           "| case | hardware | Entrain | ideal | + partition granularity | + microbatch residual | + communication | = iteration |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in cases:
        for key, who in (("gap_paper", "paper"), ("gap", "default")):
            g = c.get(key)
            if not g:
                continue
            out.append(f"| {c['dataset']} + {SHORT[c['model']]} | {c['hardware']} | {who} | {g['ideal_ms'] / 1e3:.2f} | "
                       f"{g['partition_granularity_ms'] / 1e3:+.2f} | {g['microbatch_residual_ms'] / 1e3:+.2f} | "
                       f"{g['communication_ms'] / 1e3:+.2f} | {g['iteration_time_ms'] / 1e3:.2f} |")  # fmt: skip
    return out + ["", "ideal = (K + p − 1)·t with perfectly balanced stages and microbatches; partition granularity = "
                  "1F1B with mean microbatches on our stage partition minus ideal; microbatch residual = the "
                  "compute-only simulation minus that (negative when the ramp shortens fill and drain below "
                  "1F1B's); communication = p2p waits + DP all-reduce. paper = `entrain-paper`, default = `entrain`.", ""]  # fmt: skip


def _analysis_md(res: dict) -> list[str]:
    cases = res["cases"]
    paper_cases = [c for c in cases if c["hardware"] == "a40-paper"] or cases
    missed = [t for t in res["targets"] if not t["met"]]
    out = ["## Analysis of the differences", "",
           f"{len(res['targets']) - len(missed)} of {len(res['targets'])} target checks are met (both hardware presets, "
           "with and without the ramp extension); every miss is listed above and explained here. No baseline was "
           "weakened to meet a target.", ""]  # fmt: skip

    def ratio(c, a, b="entrain"):
        return c["systems"][a]["iteration_time_ms"] / c["systems"][b]["iteration_time_ms"]

    def split_ok(c):
        return c["systems"][PAPER]["split"] == ":".join(
            map(str, PAPER_TABLE1.get((c["dataset"], c["model"]), {}).get("entrain", ()))
        )

    hw_match = {h: (sum(split_ok(c) for c in cases if c["hardware"] == h),
                    sum(1 for c in cases if c["hardware"] == h)) for h in HARDWARE}  # fmt: skip
    out.append("**Configurations (Table 1, Tables 2, 5–11).** Entrain's planner reproduces the paper's Entrain split in "
               + ", ".join(f"{m}/{n} cases under `{h}`" for h, (m, n) in hw_match.items() if n)
               + ", so `a40-paper` (per-component factors fitted to the paper's b=256 allocations) is the preset that "
               "reproduces Table 1; `a40-flops` (one FLOP efficiency for both components) does not. Our `b_min` differs "
               "from the paper's (we stop at the first size whose 59 draws all agree; the paper's tables pass at 64 or "
               "256): our generators' encoder share has a different spread, and a share close to an allocation "
               "breakpoint (LLaVA-3B under `a40-flops`) needs thousands of samples. Our one-sample DistTrain profile (the "
               "median-ratio sample of a 1,024 draw, DESIGN.md §2) is representative by construction, so our "
               "`disttrain` mostly picks Entrain's own split, unlike the paper's DistTrain (Table 1); `disttrain-paper` "
               "uses the paper's DistTrain splits.")  # fmt: skip
    out.append("")
    errs = []
    for c in paper_cases:
        p = PAPER_FIG11_S.get((c["dataset"], SHORT[c["model"]]))
        if p:
            errs.append(abs(c["systems"][PAPER]["iteration_time_ms"] / 1e3 / p[2] - 1))
    if errs:
        out.append(f"**Absolute times.** Under `a40-paper`, Entrain's simulated iteration time is within "
                   f"{100 * max(errs):.0f}% (mean {100 * sum(errs) / len(errs):.0f}%) of the paper's Fig. 11 bars. "
                   "`a40-flops` (one FLOP efficiency, no fitted factors) gives several times shorter iteration times "
                   "than the testbed's; its speedups are reported for completeness.")  # fmt: skip
        out.append("")
    dt = [ratio(c, "disttrain") for c in paper_cases]
    dtp = [ratio(c, "disttrain-paper") for c in paper_cases]
    out.append(f"**DistTrain.** Ours is {min(dt):.2f}–{max(dt):.2f}x Entrain's time (`disttrain-paper`: "
               f"{min(dtp):.2f}–{max(dtp):.2f}x) against the paper's 1.06–1.35x. Two reasons, both favouring our "
               "baseline: (1) the config — with the paper's DistTrain splits the gap grows wherever they differ from "
               "Entrain's; (2) our stand-in for DistTrain's unpublished reordering inserts whole microbatches greedily "
               "by the exact 1F1B makespan recurrence fed with the simulator's own stage times, so it places the "
               "lightest microbatches at the pipeline's fill and drain. With K = 32 and 8 stages, fill and drain are "
               "about (p − 1)/(K + p − 1) ≈ 18% of an iteration, and balanced microbatches (Entrain) always pay them "
               "in full; where variability is high (SynthChartNet) the reordering cannot hide the steady-state "
               "stalls and Entrain wins, where it is low DistTrain's shaped fill/drain can beat Entrain at the same "
               "split. Entrain's per-microbatch balance itself is confirmed (Table 3).")  # fmt: skip
    out.append("")
    dp_ = [ratio(c, "dip") for c in paper_cases]
    dg = [ratio(c, "dip-greedy") for c in paper_cases]
    mem = cases[0]["systems"]["dip"]
    over = [c for c in paper_cases if c["systems"]["dip"]["peak_activation_bytes"] > 48e9]
    out.append(f"**DIP.** The phase-ordered `dip` (all encoder forwards, LLM 1F1B, all encoder backwards — what "
               f"paper Fig. 12 shows) is {min(dp_):.2f}–{max(dp_):.2f}x Entrain's time; the greedy interleaver "
               f"`dip-greedy` is {min(dg):.2f}–{max(dg):.2f}x. `dip-greedy` beats Entrain on the low-variability "
               "datasets because colocating encoder chunk r and LLM chunk r on every rank removes the partition "
               "granularity that Entrain's disjoint E.PP:L.PP split pays (the largest term of Entrain's gap below), and "
               "size-capped sub-microbatches plus bubble filling shrink fill and drain. Our simulator is kind to DIP in "
               "three ways the paper's testbed is not: (a) a sub-microbatch costs only the cost model's per-call "
               "constants, while small GPU kernels lose real efficiency (DIP itself sizes sub-microbatches for 95% of "
               "peak); (b) DIP's greedy decisions use the exact simulated costs; (c) memory is not enforced — DIP keeps "
               f"every encoder activation until its backward, {mem['peak_activation_bytes'] / 1e9:.0f} GB of "
               f"activations on one rank for {cases[0]['dataset']} + {SHORT[cases[0]['model']]}, and in "
               f"{len(over)} of {len(paper_cases)} `a40-paper` cases DIP's activations alone exceed the A40's 48 GB, "
               "so that schedule could not run as simulated (the paper's DIP fits in 12–14 GB with its memory "
               "optimiser, at a time cost we do not model). The 1.41x target is met against `dip` on SynthChartNet "
               "but not against the stronger `dip-greedy`.")  # fmt: skip
    out.append("")
    syn = [c for c in paper_cases if c["dataset"] == "synthchartnet"]
    if syn:
        enc_r = [
            c["systems"]["disttrain"]["encoder_fwd_std_ms"]
            / max(c["systems"]["entrain"]["encoder_fwd_std_ms"], 1e-9)
            for c in syn
        ]
        llm_r = [
            c["systems"]["disttrain"]["llm_fwd_std_ms"] / max(c["systems"]["entrain"]["llm_fwd_std_ms"], 1e-9)
            for c in syn
        ]
        out.append(f"**Variability (Table 3).** On SynthChartNet Entrain's encoder forward-time std is "
                   f"{min(enc_r):.0f}–{max(enc_r):.0f}x and its LLM std {min(llm_r):.0f}–{max(llm_r):.0f}x below "
                   "DistTrain's, more than the paper's 10.6x / 4.1x: our cost model is deterministic (no kernel jitter "
                   "or measurement noise, which put a floor under the paper's Entrain std), and our DistTrain "
                   "per-microbatch std is larger than the paper's because our SynthChartNet generator keeps the regime "
                   "runs (consecutive heavy charts) that make data-order microbatches differ most.")  # fmt: skip
        out.append("")
    m3 = next((c for c in paper_cases if c["dataset"] == "synthchartnet" and SHORT[c["model"]] == "3B"), None)
    if m3:
        r7 = {
            n: m3["systems"][n]["peak_activation_bytes_per_rank"][-1] / 1e9
            for n in ("disttrain", "dip", "entrain")
        }
        out.append(f"**Memory (Fig. 13).** SynthChartNet + 3B, last rank: ours DistTrain {r7['disttrain']:.1f} GB, DIP "
                   f"{r7['dip']:.1f} GB, Entrain {r7['entrain']:.1f} GB (paper ≈ 8.5, 12–14, 5.5 GB). We count "
                   "activations only (Megatron's formula, no recomputation, no weights or optimizer state), and our "
                   "per-rank peaks are highest on the first ranks (1F1B holds p − s microbatches on stage s), where the "
                   "paper plots rank 7. The ordering matches the paper: DIP holds the most (every encoder activation "
                   "until its backward), DistTrain more than Entrain (heavy microbatches in flight together). Eager "
                   "forward raises Entrain's peak by design (compare `entrain-1f1b`), within its 1.25x budget.")  # fmt: skip
        out.append("")
    if any("sweep" in c for c in cases):
        best = sum(1 for c in cases if "sweep" in c and _best_split(c) == c["systems"][PAPER]["split"])
        tot = sum(1 for c in cases if "sweep" in c)
        out.append(f"**Sensitivity (Fig. 14).** The profiled split is the best of all seven in {best}/{tot} cases. "
                   "Bad splits cost more in our simulation than in the paper (see the 7:1 and 1:7 columns): the "
                   "simulated pipeline is purely compute-bound, so the slowest stage sets the pace exactly, while on "
                   "the testbed communication and kernel overheads compress the differences.")  # fmt: skip
        out.append("")
    gaps = [c["gap"] for c in paper_cases]
    out.append("**Entrain's gap to ideal.** Partition granularity dominates ("
               f"{min(g['partition_granularity_ms'] for g in gaps) / 1e3:.2f}–"
               f"{max(g['partition_granularity_ms'] for g in gaps) / 1e3:.2f} s under `a40-paper`): whole layers on "
               "disjoint stages cannot split a component's work exactly 1/8 per stage. The microbatch residual is "
               "small or negative (balanced microbatches run at the mean-microbatch pace; eager forward absorbs the "
               "rest) and communication is a few tens of ms (p2p overlapped by asynchronous sends, bf16 gradient "
               "all-reduce at 12.5 GB/s).")  # fmt: skip
    out.append("")
    rr = [ratio(c, RAMP) for c in paper_cases if RAMP in c["systems"]]
    if rr:
        out.append(f"**Extension: ramped fill/drain.** Cutting only the first and last p − 1 microbatches into two "
                   f"work-balanced sub-microbatches (`ScheduleOptions.ramp_microbatches`, off by default) changes "
                   f"Entrain's time by {min(rr):.2f}–{max(rr):.2f}x: it recovers the fill/drain that DistTrain's "
                   "reordering and DIP's sub-microbatches exploit, at 2(p − 1) extra per-call constants. It is not "
                   "part of the paper's Entrain and is reported separately in the targets.")  # fmt: skip
        for who, label in (("entrain", "Entrain"), (RAMP, "Entrain + ramp")):
            wins = sum(all(c["systems"][n]["iteration_time_ms"] > c["systems"][who]["iteration_time_ms"]
                           for n in BASELINES if n in c["systems"]) for c in paper_cases)  # fmt: skip
            out.append(
                f"- {label} is faster than every baseline in {wins}/{len(paper_cases)} `a40-paper` cases."
            )
        out.append("")
    return out


def _best_split(c: dict) -> str:
    valid = {k: v["iteration_time_ms"] for k, v in c["sweep"].items() if v}
    return min(valid, key=valid.get) if valid else "-"


def run(args: argparse.Namespace) -> int:
    res = bench_paper(quick=args.quick, iterations=args.iterations, sweep_iterations=args.sweep_iterations,
                      seed=args.seed, jobs=args.jobs, log=lambda m: print(m, file=sys.stderr, flush=True))  # fmt: skip
    text = render(res)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    json_path = os.path.splitext(args.out)[0] + ".json"
    with open(json_path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"entrain bench paper: wrote {args.out} and {json_path}", file=sys.stderr)
    if args.json:
        emit_json(res)
        return 0
    for t in res["targets"]:
        print(f"{'MET ' if t['met'] else 'MISS'}  {t['target']:<45} {t['case']:<40} {t['value']}")
    return 0
