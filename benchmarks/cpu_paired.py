"""Real runs against the simulator, Entrain at ``train``'s defaults vs 1F1B, encoder-rebalance and DFLOP, paired.

``python benchmarks/cpu_pipeline.py --paired --dataset WORKLOAD [--launches 3] [--steps 4]
[--profile FILE]``: per round one ``torchrun`` launch trains ``entrain``, ``1f1b``, ``encoder-rebalance``
and ``dflop`` in turn (``launch_orders``: each system first equally often) with ``--trace``; Entrain runs with every decision at ``train``'s default (decided by
simulation, ``core/planning/setups.py``). Recorded per workload: the real per-round paired ratio Entrain / 1F1B
(median iteration time over the kept steps), and the simulator's ratio for the Plans that ran (round
0's ``plan.json``) under (a) the cost model the run planned with and (b) the cost model refitted from
round 0's 1F1B trace (``entrain profile --from-trace``, ``entrain.sim.trace_fit``): 1F1B's 1 encoder + 1
LLM stage layout fits every layer, so (b) predicts Entrain's Plan out of sample. Against each
baseline (``BASELINES``) likewise: the per-round paired ratio Entrain / baseline and the ratio of the
same Plans simulated under (a) and (b) (``pair``), in a second table with its targets (real ratio <= 1.0,
|sim / real - 1| <= 5 %); passes recorded before the two newer baselines were added have only 1F1B. ``--profile FILE``
plans both systems with ``FILE`` (the closed loop: the refitted profile of an earlier pass) and is
recorded. Results are merged per workload into ``benchmarks/results/cpu_pipeline_paired.{md,json}``; a
pass's refitted profiles (``*.refit.json``, ``*.joint.json``) go beside the rounds ``--keep-runs DIR``
keeps (a closed-loop pass reads them from there), else to a temporary folder.

Every launch plans all its steps before the first one (``ENTRAIN_PLAN_PREFETCH=ahead``, ``PREFETCH``;
the first step, dropped as warm-up, carries it), so no planner process shares the 2 cores with the
ranks while the kept steps run: the pass measures each Plan's execution, which is what the simulator
prices. Per-step planning time is measured apart (``assignment_overhead.py``). Passes before this
(recorded without ``prefetch``) planned in a background process beside the ranks, DFLOP's solver
included.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from provenance import source  # benchmarks/provenance.py (scripts run from this folder)

PAIRED_SYSTEMS = ("entrain", "1f1b")
"""The pair of the first table (and of the refits fitted on traces)."""
BASELINES = ("1f1b", "encoder-rebalance", "dflop")
"""Every system Entrain is paired against in a pass, each trained in the same launch."""
PASS_SYSTEMS = ("entrain", *BASELINES)
BASE_LABELS = {"1f1b": "1F1B", "encoder-rebalance": "encoder-rebalance", "dflop": "DFLOP"}
CAPPED = 224 * 224
"""Images capped at 224 x 224 px on the image-heavy sets, so a tiny-model step takes about a second."""
PAIRED_CONFIGS = {
    "skewed": {"model": "tiny", "dataset": "skewed", "seed": 0, "global_batch": 16, "microbatch_size": 1},
    "chartqa": {"model": "tiny", "dataset": "chartqa", "max_pixels": CAPPED, "seed": 0, "global_batch": 16,
                "microbatch_size": 2},
    "text-heavy": {"model": "tiny", "dataset": "text-heavy", "max_pixels": CAPPED, "seed": 0, "global_batch": 24,
                   "microbatch_size": 4},
    "multi-image": {"model": "tiny", "dataset": "multi-image", "max_pixels": CAPPED, "seed": 0,
                    "global_batch": 16, "microbatch_size": 2},
}  # fmt: skip
"""Workloads of ``--paired``: the built-in generators (docs/workloads.md), no stage counts given (each
system's planner places its own 2-process layout)."""
WARMUP = 1
SIM_TOLERANCE = 0.05
"""The simulator's ratio within 5 % of the real paired ratio."""
REAL_TARGET = 1.0
"""Entrain's real paired ratio to each baseline at most this."""
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
STEM = "cpu_pipeline_paired"
PREFETCH = "ahead"
"""``ENTRAIN_PLAN_PREFETCH`` of every launch: each system's Plans are all made at its first step."""


def _launch(out: str, steps: int, order: list[str], config: dict, profile: str | None) -> None:
    cmd = [sys.executable, "-m", "entrain", "train", "--system", ",".join(order), "--steps", str(steps),
           "--out", out, "--no-progress", "--nproc", "2", "--trace"]  # fmt: skip
    for key, value in config.items():
        cmd += ["--" + key.replace("_", "-"), str(value)]
    if profile:
        cmd += ["--profile", profile]
    env = {**os.environ, "ENTRAIN_PLAN_PREFETCH": PREFETCH}
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)


def iter_ms(run: str) -> float:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()][WARMUP:]
    return statistics.median(r["iteration_time_ms"] for r in rows)


def cpu_over_wall(run: str) -> float:
    """Busiest rank's CPU time over wall time per kept step (median): < 1 when the rank waited or
    the machine was shared."""
    with open(os.path.join(run, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()][WARMUP:]
    return statistics.median(max(r["cpu_ms"]) / r["iteration_time_ms"] for r in rows)


def load_cost(run: str, profile: str | None = None):
    from entrain.cli.plot_trace import run_model_config
    from entrain.core.costs.costmodel import CostModel

    if profile:
        return CostModel.load(profile)
    with open(os.path.join(run, "config.json")) as f:
        return run_model_config(json.load(f)["spec"]).cost_model()


def simulated_ms(run: str, cost) -> float:
    """Median simulated iteration ms of the run's Plans (kept steps) under ``cost``."""
    from entrain.core.ir.plan import Plan
    from entrain.sim.executor import simulate_plan

    with open(os.path.join(run, "plan.json")) as f:
        plan = Plan.from_json(json.load(f))
    runs = simulate_plan(plan, cost, trace_iterations=0)[WARMUP:]
    return statistics.median(r.iteration_time_ms for r in runs)


def profile_labelled(cmd: list[str], out: str, label) -> tuple[dict, str]:
    """Run ``cmd`` (an ``entrain profile --from-trace ... --out out``), then set the written profile's
    ``notes.from_trace`` (the temporary run folders) to ``label``; the profile and the command's stdout."""
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    with open(out) as f:
        profile = json.load(f)
    profile["notes"]["from_trace"] = label
    with open(out, "w") as f:
        json.dump(profile, f, indent=1)
    return profile, done.stdout


def refit_profile(run: str, out: str, label: str) -> dict:
    """``entrain profile --from-trace run --out out``; its ``--json`` object. The profile's
    ``notes.from_trace`` (the temporary run folder) becomes ``label``."""
    cmd = [sys.executable, "-m", "entrain", "profile", "--from-trace", run, "--out", out, "--json"]
    got = json.loads(profile_labelled(cmd, out, label)[1])
    got["from_trace"]["run"] = label
    return got


def joint_fit(first: str, out: str, label: str) -> str:
    """``entrain profile --from-trace 1F1B --also-trace ENTRAIN`` of round ``first``'s two runs, written to
    ``out`` (its notes name them by ``label``): the profile a closed-loop pass plans the next pass with."""
    runs = [os.path.join(first, s) for s in ("1f1b", "entrain")]
    cmd = [sys.executable, "-m", "entrain", "profile", "--from-trace", runs[0], "--also-trace", runs[1],
           "--out", out]  # fmt: skip
    profile_labelled(cmd, out, [f"{label}, {s}" for s in ("1f1b", "entrain")])
    return out


def joint_prediction(first: str, out: str, label: str) -> dict:
    """Round 0's two Plans simulated under one profile fitted to both of its traces (``joint_fit``: the
    cuts Entrain makes inside a component priced as they ran; docs/profiling.md) -- in sample for the
    round, out of sample for the other rounds."""
    joint_fit(first, out, label)
    ms = {s: simulated_ms(os.path.join(first, s), load_cost("", out)) for s in PAIRED_SYSTEMS}
    return {"joint_sim_ms": ms, "joint_sim_ratio": ms["entrain"] / ms["1f1b"]}


def decisions_under(config: dict, profile: str | None) -> dict[str, str]:
    """Entrain's simulated decisions (``entrain simulate --json``: name -> chosen) for ``config`` on 2
    processes, planned with ``profile`` (None: the preset)."""
    cmd = [sys.executable, "-m", "entrain", "simulate", "--gpus", "2", "--systems", "entrain", "--iterations", "2",
           "--json"]  # fmt: skip
    for key, value in config.items():
        cmd += ["--" + key.replace("_", "-"), str(value)]
    if profile:
        cmd += ["--profile", profile]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    entrain = json.loads(done.stdout)["systems"]["entrain"]
    return {d["name"]: d["chosen"] for d in entrain["decisions"] if len(d["candidates"]) > 1}


def _decisions(run: str) -> dict[str, str]:
    with open(os.path.join(run, "plan.json")) as f:
        plan = json.load(f)
    stages = [
        f"{s['component']}[{s['layers'][0]},{s['layers'][1]})@{s['pp_rank']}"
        for s in plan["layout"]["stages"]
    ]
    opts = plan.get("options", {})
    chosen = opts.get("assignment_chosen")
    flat = [a for per in chosen for a in per] if chosen else [opts.get("assignment", "paper")]
    return {
        "stages": " ".join(stages),
        "split_weight_grads": str(bool(opts.get("split_weight_grads", False))),
        "assignment": ", ".join(f"{a} {flat.count(a)}" for a in sorted(set(flat))),
    }


def predictions(first: str, refit_path: str, profile: str | None, label: str, systems=PAIRED_SYSTEMS) -> dict:
    """Round 0's Plans of ``systems`` simulated under the planning cost model and the 1F1B-trace refit,
    and Entrain's and 1F1B's under the joint refit (``label``: the round, named in the refitted profiles'
    notes)."""
    base = {
        s: simulated_ms(os.path.join(first, s), load_cost(os.path.join(first, s), profile)) for s in systems
    }
    fit = refit_profile(os.path.join(first, "1f1b"), refit_path, f"{label}, 1f1b")
    refit = {s: simulated_ms(os.path.join(first, s), load_cost("", refit_path)) for s in systems}
    joint = joint_prediction(first, refit_path.replace(".refit.json", ".joint.json"), label)
    return {
        **joint,
        "sim_ms": base,
        "sim_ratio": base["entrain"] / base["1f1b"],
        "refit_sim_ms": refit,
        "refit_sim_ratio": refit["entrain"] / refit["1f1b"],
        "refit_errors": fit["from_trace"]["errors"],
        "refit_overhead_ms_per_action": fit["from_trace"]["overhead_ms_per_action"],
    }


def pair(per_round: list[dict], sim_ms: dict, refit_ms: dict, base: str) -> dict:
    """Entrain against ``base``: the paired per-round real ratios Entrain / ``base`` (each round's
    iteration ms of the same launch) and their median, and the same Plans' simulated ratio under the
    planning cost model (``sim_ms``) and the refit (``refit_ms``), each with its error sim / real - 1 and
    whether the targets hold (real <= ``REAL_TARGET``, |error| <= ``SIM_TOLERANCE``)."""
    ratios = [r["entrain"] / r[base] for r in per_round]
    real = statistics.median(ratios)
    sim = sim_ms["entrain"] / sim_ms[base]
    refit = refit_ms["entrain"] / refit_ms[base]
    return {
        "ratios": ratios,
        "real_ratio": real,
        "sim_ratio": sim,
        "sim_rel_error": sim / real - 1,
        "refit_sim_ratio": refit,
        "refit_sim_rel_error": refit / real - 1,
        "real_met": real <= REAL_TARGET,
        "sim_met": abs(sim / real - 1) <= SIM_TOLERANCE,
    }


def launch_orders(systems, rounds: int, seed: int) -> list[list[str]]:
    """Each round's launch order: a Williams square over ``systems`` in an order drawn from ``seed``
    (row ``i``: the first row ``0, 1, n-1, 2, n-2, ...`` shifted by ``i``; for an odd count the rows
    reversed too), its rows in turn. Over a full square (``n`` rounds, ``2n`` for odd ``n``) every system
    runs first, and in every place, equally often, and follows every other system right after it
    equally often; over any ``rounds``, first as often as any other give or take one. The orders drawn
    per round before (``rng.sample``) could leave a system never first: Entrain in none of the 6
    rounds of the four-systems passes of seed 0."""
    names = random.Random(seed).sample(list(systems), len(systems))
    n, first, lo, hi = len(names), [0], 1, len(names) - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    square = [[names[(j + i) % n] for j in first] for i in range(n)]
    if n % 2:
        square += [row[::-1] for row in square]
    return [square[i % len(square)] for i in range(rounds)]


def run_workload(
    name: str,
    rounds: int,
    steps: int,
    seed: int,
    profile: str | None,
    refit_out: str,
    keep: str | None = None,
    systems: tuple[str, ...] = PASS_SYSTEMS,
) -> dict:
    """One pass: ``rounds`` launches each training ``systems`` (in ``launch_orders``), Entrain paired
    against each of the others (``pair``); the first table's 1F1B columns at the top level."""
    config = PAIRED_CONFIGS[name]
    per_round, orders, cpu_wall = [], launch_orders(systems, rounds, seed), []
    with tempfile.TemporaryDirectory(prefix="entrain-paired-") as tmp:
        for i in range(rounds):
            out = os.path.join(tmp, f"round{i}")
            _launch(out, steps, orders[i], config, profile)
            per_round.append({s: iter_ms(os.path.join(out, s)) for s in systems})
            cpu_wall.append({s: cpu_over_wall(os.path.join(out, s)) for s in systems})
            if keep:
                shutil.copytree(out, os.path.join(keep, name, f"round{i}"), dirs_exist_ok=True)
        first = os.path.join(tmp, "round0")
        pred = predictions(
            first, refit_out, profile, f"round 0 of `cpu_pipeline.py --paired --dataset {name}`", systems
        )
        decisions = {s: _decisions(os.path.join(first, s)) for s in systems}
    pairs = {b: pair(per_round, pred["sim_ms"], pred["refit_sim_ms"], b) for b in systems if b != "entrain"}
    ratios = pairs["1f1b"]["ratios"]
    real = pairs["1f1b"]["real_ratio"]
    return {
        "config": config,
        "profile": os.path.basename(profile) if profile else None,
        "prefetch": PREFETCH,
        "rounds": rounds,
        "steps": steps,
        "orders": orders,
        "iter_ms": per_round,
        "busiest_cpu_over_wall": cpu_wall,
        "ratios": ratios,
        "real_ratio": real,
        **pred,
        "sim_rel_error": pred["sim_ratio"] / real - 1,
        "refit_sim_rel_error": pred["refit_sim_ratio"] / real - 1,
        "joint_sim_rel_error": pred["joint_sim_ratio"] / real - 1,
        "decisions": decisions,
        "pairs": pairs,
        "decisions_planned": decisions_under(config, profile),
        "decisions_refit": decisions_under(config, refit_out),
        "refit_action_overhead_ms": load_cost("", refit_out).hardware.action_overhead_ms,
    }


def _cpu_share(r: dict) -> str:
    """Median over rounds of the busiest rank's CPU / wall, Entrain / 1F1B."""
    return " / ".join(
        f"{statistics.median(x[s] for x in r['busiest_cpu_over_wall']):.2f}" for s in PAIRED_SYSTEMS
    )


def _joint(r: dict) -> str:
    """The joint refit's ratio and error (passes before it existed: not computed)."""
    if "joint_sim_ratio" not in r:
        return "- | -"
    return f"{r['joint_sim_ratio']:.3f} | {r['joint_sim_rel_error']:+.1%}"


def _row(key: str, r: dict) -> str:
    it = r["iter_ms"]
    med = {s: statistics.median(x[s] for x in it) for s in PAIRED_SYSTEMS}
    ok = "yes" if r["real_ratio"] <= 1.0 else "**no**"
    return (
        f"| {key} | {r['profile'] or 'cpu-tiny'} | {r['rounds']} x {r['steps']} | {med['entrain']:.0f} | {med['1f1b']:.0f} | "
        f"{r['real_ratio']:.3f} ({min(r['ratios']):.3f}-{max(r['ratios']):.3f}) | {ok} | {r['sim_ratio']:.3f} | "
        f"{r['sim_rel_error']:+.1%} | {r['refit_sim_ratio']:.3f} | {r['refit_sim_rel_error']:+.1%} | {_joint(r)} | "
        f"{_cpu_share(r)} | "
        f"{r['decisions']['entrain']['stages']}; split {r['decisions']['entrain']['split_weight_grads']}; "
        f"{r['decisions']['entrain']['assignment']} |"
    )


def _pair_row(key: str, r: dict, base: str) -> str:
    """The second table's row of pass ``key`` for Entrain / ``base``."""
    p = r["pairs"][base]
    med = {s: statistics.median(x[s] for x in r["iter_ms"]) for s in ("entrain", base)}
    cpu = " / ".join(
        f"{statistics.median(x[s] for x in r['busiest_cpu_over_wall']):.2f}" for s in ("entrain", base)
    )
    real_ok = "yes" if p["real_met"] else "**no**"
    sim_ok = "yes" if p["sim_met"] else "**no**"
    return (
        f"| {key} | {BASE_LABELS.get(base, base)} | {r['profile'] or 'cpu-tiny'} | {r['rounds']} x {r['steps']} | "
        f"{med['entrain']:.0f} | {med[base]:.0f} | {p['real_ratio']:.3f} ({min(p['ratios']):.3f}-{max(p['ratios']):.3f}) | "
        f"{real_ok} | {p['sim_ratio']:.3f} | {p['sim_rel_error']:+.1%} | {sim_ok} | {p['refit_sim_ratio']:.3f} | "
        f"{p['refit_sim_rel_error']:+.1%} | {cpu} | {r['decisions'][base]['stages']} |"
    )


def _pair_targets(results: dict) -> list[str]:
    """One target line per baseline and target over the passes of the second table: met on how many,
    and the passes where not (with the ratio or the error)."""
    lines = []
    for base in BASELINES:
        got = {k: r["pairs"][base] for k, r in results.items() if base in r.get("pairs", {})}
        if not got:
            continue
        label = BASE_LABELS.get(base, base)
        for what, flag, value in (
            (f"Entrain / {label} real ratio <= {REAL_TARGET}", "real_met", lambda p: f"{p['real_ratio']:.3f}"),
            (f"Entrain / {label} |sim / real - 1| <= {SIM_TOLERANCE:.0%}", "sim_met",
             lambda p: f"{p['sim_rel_error']:+.1%}"),
        ):  # fmt: skip
            missed = [f"{k} {value(p)}" for k, p in got.items() if not p[flag]]
            met = len(got) - len(missed)
            tail = f"; NOT met on {', '.join(missed)}" if missed else ""
            lines.append(f"Target: {what}: met on {met} of {len(got)}{tail}.")
    return lines


def _pair_table(results: dict) -> list[str]:
    """The second table: Entrain paired against each baseline trained in the same launches (passes
    that recorded ``pairs``), then its target lines."""
    keys = [k for k, r in results.items() if r.get("pairs")]
    if not keys:
        return []
    lines = [
        "",
        "Entrain paired against each baseline trained in the same launches (passes that trained "
        "`entrain`, `1f1b`, `encoder-rebalance` and `dflop` in each launch, order drawn per round): real ratio = "
        "median over rounds of Entrain's median iteration ms / the baseline's of the same launch (min-max in "
        "brackets); sim ratio = round 0's two Plans simulated under the cost model they were planned with, "
        "refit = under the profile refitted from round 0's 1F1B trace; error = sim / real - 1. On 2 processes "
        "every baseline's planner places 1 encoder + 1 LLM stage on one replica, where encoder-rebalance has "
        "no other replica to move encoder work to.",
        "",
        "| workload (pass) | Entrain / | planned with | rounds x steps | Entrain ms | baseline ms | real ratio | "
        "<= 1.0 | sim ratio | error | within 5 % | refit sim ratio | error | busiest rank CPU / wall (E / baseline) | "
        "baseline's plan (round 0) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_pair_row(k, results[k], b) for k in keys for b in BASELINES if b in results[k]["pairs"]]
    return [*lines, "", *_pair_targets({k: results[k] for k in keys})]


def _decision_text(decisions: dict[str, str]) -> str:
    return ", ".join(f"{name} {chosen}" for name, chosen in decisions.items())


def _source_lines(sources: list[dict]) -> list[str]:
    """One ``Source:`` line a current pass (``recorded["sources"]``), its note after the command."""
    return [f"Source: commit {s['commit']}, `{s['command']}`" + (f" {s['note']}" if s.get("note") else "")
            for s in sources]  # fmt: skip


def report(results: dict, idle: dict, sources: list[dict] = ()) -> str:
    lines = [
        "# Real runs against the simulator: Entrain (defaults) / 1F1B, paired per round",
        "",
        *_source_lines(sources),
        *([""] if sources else []),
        "Generated by `python benchmarks/cpu_pipeline.py --paired --dataset WORKLOAD` (module "
        "`benchmarks/cpu_paired.py`): tiny model, 2 processes, one launch per round training both systems "
        f"with `--trace`, first {WARMUP} step dropped. Real ratio = median over rounds of Entrain's median "
        "iteration ms / 1F1B's of the same launch (min-max in brackets). Sim ratio = the same Plans (round 0) "
        "simulated under the cost model they were planned with; refit = under the profile refitted from round "
        "0's 1F1B trace (`entrain profile --from-trace`); joint = under one profile fitted to both of round 0's "
        "traces (`--from-trace 1F1B --also-trace ENTRAIN`: in sample for round 0's cuts, out of sample for the "
        "other rounds); error = sim / real - 1 (target |error| <= 5 %). Busiest "
        "rank CPU / wall: its process CPU time over the iteration's wall time (1.0 on an idle machine; below, the "
        "rank waited or shared the 2 cores with other jobs). Planned with: the `cpu-tiny` preset, or the profile "
        "the pass read with `--profile` (a closed loop: an earlier pass's refit, written beside the rounds it "
        "kept); the profiles the passes below read are in the repository's history, not in `benchmarks/results/`.",
        "",
        "| workload (pass) | planned with | rounds x steps | Entrain ms | 1F1B ms | real ratio | <= 1.0 | sim ratio | "
        "error | refit sim ratio | error | joint refit sim ratio | error | busiest rank CPU / wall (E / 1F1B) | "
        "Entrain's plan (round 0) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(k, r) for k, r in results.items()]
    notes: dict[str, list[str]] = {}
    for k, r in results.items():
        if r.get("note"):
            notes.setdefault(r["note"], []).append(k)
    lines += ["", *(f"Note on {', '.join(keys)}: {note}." for note, keys in notes.items())] if notes else []
    lines += _pair_table(results)
    lines += ["", "Entrain's simulated decisions (`entrain simulate --json`, those with more than one candidate) "
              "under the cost model the pass planned with, and under the profile refitted from its 1F1B trace "
              "(measured per-action overhead in brackets):", "",
              "| workload (pass) | planned with | refit (overhead ms/action) |", "|---|---|---|"]  # fmt: skip
    for k, r in results.items():
        if "decisions_planned" in r:
            lines.append(f"| {k} | {_decision_text(r['decisions_planned'])} | "
                         f"{_decision_text(r['decisions_refit'])} ({r['refit_action_overhead_ms']:.2f}) |")  # fmt: skip
    lines += ["", "Idle check before each pass (fraction of the 2 cores idle; target 90 %): "
              + "; ".join(f"{k} {'passed' if v[0] else 'NOT passed'} ({v[1]:.0%})" for k, v in idle.items()), ""]  # fmt: skip
    return "\n".join(lines) + "\n"


def rescore_joint(args) -> int:
    """``--rescore-joint DIR``: add the joint refit's prediction to the recorded pass ``--dataset`` /
    ``--pass-name`` from the round folders it kept (``--keep-runs DIR``), without running it again."""
    key = _key(args)
    recorded = _recorded(args.out)
    r = recorded["results"][key]
    out = os.path.join(args.rescore_joint, f"{STEM}_{_slug(args)}.joint.json")
    label = f"round 0 of `cpu_pipeline.py --paired --dataset {args.dataset}`"
    r.update(joint_prediction(os.path.join(args.rescore_joint, args.dataset, "round0"), out, label))
    r["joint_sim_rel_error"] = r["joint_sim_ratio"] / r["real_ratio"] - 1
    _save(args.out, recorded)
    print(f"{key}: joint refit sim ratio {r['joint_sim_ratio']:.3f} ({r['joint_sim_rel_error']:+.1%})")
    return 0


def _slug(args) -> str:
    return args.dataset + (
        "_" + re.sub(r"[^a-z0-9]+", "-", args.pass_name.lower()).strip("-") if args.pass_name else ""
    )


def _key(args) -> str:
    """The pass's key in the results: the workload, and ``--pass-name`` in brackets."""
    return args.dataset + (f" ({args.pass_name})" if args.pass_name else "")


@contextlib.contextmanager
def _profiles_folder(keep: str | None):
    """Where a pass writes its refitted profiles: ``keep`` (``--keep-runs``), else a temporary folder."""
    if keep:
        os.makedirs(keep, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="entrain-paired-profiles-") as tmp:
        yield tmp


def main_paired(args, idle: tuple[bool, float]) -> int:
    key = _key(args)
    os.makedirs(args.out, exist_ok=True)
    with _profiles_folder(args.keep_runs) as profiles:
        refit_out = os.path.join(profiles, f"{STEM}_{_slug(args)}.refit.json")
        result = run_workload(
            args.dataset, args.launches, args.steps, args.order_seed, args.profile, refit_out, args.keep_runs
        )
    recorded = _recorded(args.out)
    recorded["results"][key] = result
    recorded["idle"][key] = list(idle)
    src = source()
    command = src["command"].replace(f"--dataset {args.dataset}", "--dataset WORKLOAD")
    sources = [s for s in recorded.get("sources", []) if s["command"] != command]
    recorded["sources"] = [*sources, {"commit": src["commit"], "command": command}]
    result["source"] = src
    print(_save(args.out, recorded))
    return 0


def _recorded(out: str) -> dict:
    """``cpu_pipeline_paired.json`` of ``out`` (empty if none yet)."""
    path = os.path.join(out, f"{STEM}.json")
    return json.load(open(path)) if os.path.exists(path) else {"results": {}, "idle": {}}


def render(recorded: dict) -> str:
    """``cpu_pipeline_paired.md`` of ``recorded``: the paired passes' report, then other modes' sections
    (``cpu_omni.py``)."""
    text = report(recorded["results"], recorded["idle"], recorded.get("sources", []))
    return text + "".join(recorded.get("sections", {}).values())


def _save(out: str, recorded: dict) -> str:
    """Write ``recorded`` and its report to ``out``; the report's text."""
    with open(os.path.join(out, f"{STEM}.json"), "w") as f:
        json.dump(recorded, f, indent=1)
    text = render(recorded)
    with open(os.path.join(out, f"{STEM}.md"), "w") as f:
        f.write(text)
    return text
