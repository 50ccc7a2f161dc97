"""Re-planning on drift (``--replan auto``) on the ``curriculum`` dataset, in simulation, against
static Entrain and every baseline; plus a real CPU run's iteration times (``--real``).

    python benchmarks/replan.py --model qwen25vl-llama3-1b --out /tmp/replan1 &   # the models in parallel
    python benchmarks/replan.py --model qwen25vl-llama3-3b --out /tmp/replan3; wait
    python benchmarks/replan.py --real-run /tmp/real          # the real CPU run: /tmp/real/real.json
    python benchmarks/replan.py --merge /tmp/replan1.json /tmp/replan3.json --real /tmp/real/real.json
                                                             # writes benchmarks/results/replan.{md,json}

Setup: the paper's (64 GPUs, DP 4, TP 2, global batch 512, microbatch size 4, a40-paper), ``--iterations``
(default 6: two per phase; chartqa-like, then docvqa-like, then video-like), seed 0. Rows, all on the
same batches:

* ``entrain (adaptive)``: planned on the whole mix (the dataset's profiling pool), then the drift
  monitor (``entrain.sim.drift``, ``--replan-window`` 1 here, default threshold and re-plan cost)
  re-plans on the window; each segment runs its own plan;
* ``entrain (static, whole mix)``: Algorithms 1-2 on the whole mix (what ``simulate`` plans);
* ``entrain (static, whole mix, split by simulation)``: the re-planner's own choice (Algorithms 1-2
  and each other encoder/LLM GPU budget's best Algorithm 2 configuration, the fastest simulated; see
  ``entrain.sim.adaptive.window_replanner``) made once, on the whole mix's planner draws: what
  adaptivity adds beyond the simulated choice of the split;
* ``entrain (static, first phase)``: Algorithms 1-2 on the first phase's dataset (chartqa);
* the baselines (1F1B, DistTrain, DIP, DIP-greedy) as ``simulate`` configures them (on the whole mix).

Economy (this ran on a shared 2-core machine): every plan is simulated as planned, without the
simulated memory check (``sim.memory_fit``: recomputation where a rank overflows, which re-simulates
a plan many times on these large docvqa/video batches); a plan that overflows device memory is marked
in the ``fits`` column, not fixed. Entrain's rows use the paper's disjoint layout (no boundary-sharing
judge) for the same reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from entrain.cli.common import resolve_cost_model, workload_source
from entrain.cli.main import build_parser
from entrain.config import RunConfig
from entrain.core.errors import ConfigError
from entrain.core.setups import system_setups
from entrain.data.generators import CURRICULUM_PHASES, batch_source
from entrain.data.sampling import dataset_sampler
from entrain.sim.adaptive import adaptive_deploy, monitor_for, window_replanner, window_time
from entrain.sim.choose import planner_draws
from entrain.sim.drift import ReplanSettings
from entrain.sim.run import run_system

MODELS = {"qwen25vl-llama3-1b": "1B", "qwen25vl-llama3-3b": "3B"}
BASELINES = ("1f1b", "disttrain", "dip", "dip-greedy")
TARGET = 1.10
OUT = Path(__file__).parent / "results" / "replan"
ADAPTIVE, MIX, FIRST = "entrain (adaptive)", "entrain (static, whole mix)", "entrain (static, first phase)"
MIX_SIM = "entrain (static, whole mix, split by simulation)"


def _args(model: str, iterations: int, replan: str = "off", window: int = 1):
    argv = ["simulate", "--dataset", "curriculum", "--model", model, "--gpus", "64", "--dp", "4", "--tp", "2",
            "--global-batch", "512", "--microbatch-size", "4", "--iterations", str(iterations),
            "--replan", replan, "--replan-window", str(window), "--entrain-layout", "disjoint"]  # fmt: skip
    return build_parser().parse_args(argv)


def _row(run, config: dict | None = None, iterations: int = 0) -> dict:
    m = run.metrics
    per = list(m.iteration_time_ms_per_iter)
    phases = {}
    for name in CURRICULUM_PHASES:
        ts = [t for i, t in enumerate(per) if batch_source("curriculum", i, iterations) == name]
        phases[name] = sum(ts) / len(ts) if ts else None
    comps = run.layout.components
    return {
        "iteration_time_ms": m.iteration_time_ms,
        "per_iteration_ms": per,
        "per_phase_ms": phases,
        "fits_memory": m.fits_memory,
        "split": f"E.PP {comps['encoder'].pp} / L.PP {comps['llm'].pp} (dp {run.layout.dp})",
        "replans": list(run.replans or []),
        "config_source": (config or {}).get("source"),
    }


def _context(model: str, iterations: int):
    args = _args(model, iterations)
    cost = resolve_cost_model(args)
    batches = list(workload_source(args, cost).batches(args.global_batch, args.iterations))
    req = dataclasses.replace(RunConfig.from_args(args).config_request(), model=cost.model)
    return args, cost, batches, req


def _simulated(system: str, setup, batches, cost, extra: dict):
    return run_system(system, setup.layout, batches, cost, {**setup.options, **extra}, trace_iterations=0)


def run_model(model: str, iterations: int, window: int) -> dict:
    """Every row on the same batches; plans simulated as planned (no memory check: see the md)."""
    args, cost, batches, req = _context(model, iterations)
    extra = {"eager_budget_factor": args.eager_budget_factor}
    mix = dataset_sampler("curriculum", args.seed)
    setups = system_setups(["entrain", *BASELINES], req, cost, mix)
    rows, seconds, t = {}, {}, time.time()
    monitor = monitor_for("entrain", setups["entrain"], req, cost, mix, total_iterations=iterations,
                          settings=ReplanSettings(window=window), extra_options=extra)  # fmt: skip
    got = adaptive_deploy("entrain", monitor, batches, cost, extra, memory_check=False)
    got.run.replans = [r.to_json() for r in monitor.replans]
    rows[ADAPTIVE], seconds[ADAPTIVE] = _row(got.run, None, iterations), time.time() - t
    t = time.time()
    first_req = dataclasses.replace(req, dataset=CURRICULUM_PHASES[0])
    first = system_setups(["entrain"], first_req, cost, dataset_sampler(CURRICULUM_PHASES[0], args.seed))
    rows[FIRST] = _row(_simulated("entrain", first["entrain"], batches, cost, extra), None, iterations)
    rows[MIX] = _row(_simulated("entrain", setups["entrain"], batches, cost, extra), None, iterations)
    draws = planner_draws(mix, cost, req)
    best = window_replanner("entrain", req, cost, window_time("entrain", cost, extra))(draws)
    rows[MIX_SIM] = _row(_simulated("entrain", best, batches, cost, extra), None, iterations)
    for name in BASELINES:
        rows[name] = _row(_simulated(name, setups[name], batches, cost, {}), None, iterations)
    seconds["static + baselines"] = time.time() - t
    drift = [d.to_json() for d in monitor.history]
    return {"model": MODELS[model], "iterations": iterations, "window": window, "rows": rows, "seconds": seconds,
            "drift": drift}  # fmt: skip


def _case_md(case: dict) -> list[str]:
    rows = case["rows"]
    adaptive = rows[ADAPTIVE]["iteration_time_ms"]
    best_static = min(rows[MIX]["iteration_time_ms"], rows[FIRST]["iteration_time_ms"])
    ratio = best_static / adaptive
    ratio_sim = rows[MIX_SIM]["iteration_time_ms"] / adaptive
    out = [f"### {case['model']} ({case['iterations']} iterations, window {case['window']})", "",
           "| system | mean iter ms | chartqa-like | docvqa-like | video-like | vs adaptive | fits | split (first) |",
           "|---|---:|---:|---:|---:|---:|---|---|"]  # fmt: skip
    for name, r in rows.items():
        ph = [f"{r['per_phase_ms'][p]:.0f}" if r["per_phase_ms"][p] else "-" for p in CURRICULUM_PHASES]
        out.append(f"| {name} | {r['iteration_time_ms']:.0f} | {' | '.join(ph)} | "
                   f"{r['iteration_time_ms'] / adaptive:.3f}x | {r['fits_memory']} | {r['split']} |")  # fmt: skip
    verdict = "meets" if ratio >= TARGET else "misses"
    out += [
        "",
        f"Adaptive vs the better static Entrain (first phase / whole mix): **{ratio:.3f}x** ({verdict} the "
        f"{TARGET:.2f}x target); vs the static split chosen by the same simulated search on the whole mix: "
        f"**{ratio_sim:.3f}x**.",
        "",
    ]
    for rp in rows[ADAPTIVE]["replans"]:
        old, new = rp["old_allocation"], rp["new_allocation"]
        out.append(f"- re-plan after iteration {rp['iteration']}: E.PP {old['encoder']['pp']} / L.PP {old['llm']['pp']} "
                   f"(dp {old['dp']}) -> E.PP {new['encoder']['pp']} / L.PP {new['llm']['pp']} (dp {new['dp']}), "
                   f"predicted gain {rp['predicted_gain']:.1%}")  # fmt: skip
    if not rows[ADAPTIVE]["replans"]:
        out.append("- no re-plan fired")
    out += [
        "",
        "Simulation wall time (s): " + ", ".join(f"{k} {v:.0f}" for k, v in case["seconds"].items()),
        "",
    ]
    return out


def _real_md(real: dict) -> list[str]:
    out = [
        "## Real CPU run (tiny model, 4 gloo ranks, two-phase workload file)",
        "",
        f"`{real.get('command', '')}`",
        "",
    ]
    for rp in real.get("replans", []):
        old, new = rp["old_allocation"], rp["new_allocation"]
        out.append(f"- re-plan after step {rp['iteration']}: E.PP {old['encoder']['pp']} / L.PP {old['llm']['pp']} "
                   f"(dp {old['dp']}) -> E.PP {new['encoder']['pp']} / L.PP {new['llm']['pp']} (dp {new['dp']}), "
                   f"predicted gain {rp['predicted_gain']:.1%}")  # fmt: skip
    if not real.get("replans"):
        out.append("- no re-plan fired")
    out += ["", "| step | phase | measured iteration ms | layout |", "|---:|---|---:|---|"]
    for s in real.get("steps", []):
        out.append(f"| {s['step']} | {s['phase']} | {s['iteration_ms']:.0f} | {s['layout']} |")
    steps_s = sum(s["iteration_ms"] for s in real.get("steps", [])) / 1000
    out += ["", f"Summary: `{' '.join(real.get('summary', []))}`", "",
            f"Whole command {real.get('wall_s', 0):.0f} s, of which the steps {steps_s:.0f} s: the rest is "
            "process start-up, planning, the re-plan's checkpoints and restarts (measured, not the estimate).", ""]  # fmt: skip
    out += [f"    {x}" for x in real.get("restarts", [])]  # the launcher's lines
    return out + ["", real.get("note", ""), ""]


FINDINGS = """## What was measured (2026-12-04, seed 0)

- **The target is missed: no re-plan fired at the paper's setup**, so adaptive Entrain equals static
  Entrain on the whole mix (1.000x); Entrain planned on the first phase (chartqa) is *faster* than both
  (1B: 0.871x the adaptive time, 3B: 0.904x), and so is DistTrain for 1B (0.964x).
- Why the monitor did not re-plan: its predicted gains were negative at every evaluation (`drift` in
  `replan.json`). With two iterations per phase the remaining horizon is 1-5 iterations, and the
  estimated re-plan cost (60 s restart + checkpoint transfers) is 5x a chartqa iteration; on the
  docvqa window the best split found (Algorithms 1-2 and every other encoder GPU budget, simulated)
  is at most ~3 % faster than the current one, under the 5 % threshold even over a long horizon.
- The video phase is not even evaluated: its mean work per sample is within 1.5x of the whole mix's
  (drift 0.19-0.23 < ln 1.5), yet a different split (the first-phase plan, E.PP 5 / L.PP 3) runs it
  25 % faster (1B: 79.5 vs 106.6 s). The gate watches the amount of work per resource, not the
  split's fit, so it misses drifts that keep the totals; and Algorithm 2's Eq. 2 choice on the whole
  mix (E.PP 5 / L.PP 2, 14 of 16 GPUs a replica) is not the simulator's best for any phase.
- Every row overflows device memory here (`fits` False): the economy protocol skips the simulated
  memory check, which would add recomputation; the times compare plans as planned.
- Next steps (not done): gate on the simulated time of the current split vs the window's best every
  `window` iterations (no work-ratio gate), a longer run per phase (hundreds of iterations make the
  restart negligible), and the memory check on each segment.
"""


def write_md(cases: list[dict], real: dict | None) -> str:
    lines = ["# Re-planning on drift: `curriculum` (benchmarks/replan.py)", "",
             (__doc__ or "").split("Setup:")[1].strip(), "",
             "Times: simulated ms per iteration (a40-paper); `vs adaptive` = the row's mean / adaptive Entrain's. "
             "The adaptive row includes no re-plan pause: `predicted_gain` already nets out the estimated "
             "checkpoint + restart + reshard cost (`entrain.sim.drift.replan_cost_ms`).", ""]  # fmt: skip
    for case in cases:
        lines += _case_md(case)
    lines += [FINDINGS]
    if real:
        lines += _real_md(real)
    return "\n".join(lines) + "\n"


REAL_PHASES = ("chartqa", "text-heavy")
REAL_FLAGS = ["--model", "tiny", "--system", "entrain", "--global-batch", "8", "--microbatch-size", "1",
              "--max-pixels", "100352", "--no-progress", "--replan", "auto", "--replan-restart-s", "0"]  # fmt: skip


def real_run(folder: Path, steps: int, nproc: int) -> dict:
    """``entrain train --nproc`` on a two-phase workload file (``REAL_PHASES``, half the steps each):
    the re-plans and each step's measured iteration time and layout."""
    import subprocess

    from entrain.data.generators import generate_samples
    from entrain.data.workload_io import write_workload_jsonl

    folder.mkdir(parents=True, exist_ok=True)
    half = steps // 2 * 8
    data = folder / "two_phase.jsonl"
    write_workload_jsonl(str(data), [s for p in REAL_PHASES for s in generate_samples(p, half, 0)])
    out = folder / "run"
    cmd = [sys.executable, "-m", "entrain", "train", "--dataset", str(data), "--steps", str(2 * (steps // 2)),
           "--nproc", str(nproc), "--out", str(out), "--overwrite", *REAL_FLAGS]  # fmt: skip
    t = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall_s = time.time() - t
    if done.returncode != 0:
        raise SystemExit(f"the real run failed ({done.returncode}): {done.stderr[-2000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    replans = [r["replan"] for r in rows if "replan" in r]
    return {
        "command": "entrain train " + " ".join(cmd[4:]).replace(str(folder), "DIR"),
        "replans": replans,
        "steps": [_real_step(r, replans, steps) for r in rows],
        "summary": done.stdout.strip().splitlines()[-1:],
        "wall_s": wall_s,
        "restarts": [x for x in done.stderr.splitlines() if "re-plan" in x or "resuming" in x],
        "note": f"{nproc} gloo ranks on a shared 2-core CPU: measured times include other processes' load. The "
        "monitor's predicted gains come from the tiny model's cost model (simulated hardware, not this CPU), "
        "with the restart cost set to 0 (--replan-restart-s 0); the before/after times are too noisy here "
        "to show a gain or a loss.",
    }


def _real_step(row: dict, replans: list[dict], steps: int) -> dict:
    before = [r for r in replans if r["iteration"] < row["step"]]
    alloc = before[-1]["new_allocation"] if before else (replans[0]["old_allocation"] if replans else None)
    layout = (
        "-"
        if alloc is None
        else f"E.PP {alloc['encoder']['pp']} / L.PP {alloc['llm']['pp']} (dp {alloc['dp']})"
    )
    phase = REAL_PHASES[min(1, row["step"] // max(1, steps // 2))]
    return {"step": row["step"], "phase": phase, "iteration_ms": row["iteration_time_ms"], "layout": layout}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODELS, action="append")
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--window", type=int, default=1)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--merge", nargs="*")
    p.add_argument("--real", default=None, help="a real run's JSON (see docs) to add to the md")
    p.add_argument(
        "--real-run", default=None, help="run the real CPU run in this folder, write its JSON there"
    )
    p.add_argument("--real-steps", type=int, default=10)
    args = p.parse_args(argv)
    if args.real_run:
        got = real_run(Path(args.real_run), args.real_steps, 4)
        (Path(args.real_run) / "real.json").write_text(json.dumps(got, indent=1) + "\n")
        print(json.dumps(got["replans"]), file=sys.stderr)
        return 0
    real = json.loads(Path(args.real).read_text()) if args.real else None
    if args.merge is not None:
        cases = [c for f in args.merge for c in json.loads(Path(f).read_text())["cases"]]
    else:
        cases = []
        for model in args.model or list(MODELS):
            try:
                cases.append(run_model(model, args.iterations, args.window))
            except ConfigError as err:
                print(f"{model}: {err}", file=sys.stderr)
                return 2
            print(f"{model} done", file=sys.stderr, flush=True)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"cases": cases, "real": real}, indent=1) + "\n")
    out.with_suffix(".md").write_text(write_md(cases, real))
    print(f"wrote {out.with_suffix('.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
