"""Regression guard: every system's simulated iteration time on the paper's 16 cases, the workload
zoo's 20 and the paper's headline command, against a committed baseline.

    python benchmarks/regression.py                 # compare a fresh run with the baseline, write the report
    python benchmarks/regression.py --update --why TEXT   # rewrite the baseline (its own commit, saying why)
    python benchmarks/regression.py --update --why TEXT --from benchmarks/results/regression.json  # the last run
    python benchmarks/regression.py --from benchmarks/results/regression.json --note TEXT  # re-render the report
    python benchmarks/regression.py --case synthchartnet/1B/a40-paper/seed0   # some cases only

The cases are imported, never retyped: ``entrain bench paper``'s datasets x models x hardware presets
(``entrain.cli.bench``) and ``benchmarks/workload_zoo.py``'s workloads x models (a40-paper). The
8 cases both lists hold (the paper's datasets on a40-paper) run once and count for both. Every case
runs ``entrain simulate``'s path (``cli.simulate.simulate_systems``: each system with the
configuration its own method picks, the simulated memory check included) with the settings the
baseline records (``settings``: iterations, seed, the exact argv), so a run is comparable.
``headline`` is the issue-21 command itself (seed 3, 5 iterations, simulate's default systems).

Verdict (exit status): 1 when Entrain (``entrain``) is more than ``TOLERANCE`` slower than its
baseline on any case, or a case/system of the baseline is missing or fails; 2 when only other
systems got slower than ``TOLERANCE`` or lost their memory fit. A baseline system that gets slower
makes Entrain look better, so it fails too (exit 2 tells it apart): either the slowdown is a bug,
or it is intended and the baseline is rewritten (``--update``) in a commit of its own that says
why. Any system faster by more than ``TOLERANCE`` is listed (not a failure: a faster baseline makes
Entrain look worse, nothing is hidden). 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import workload_zoo as zoo

from entrain.cli import bench as paper
from entrain.cli.main import build_parser
from entrain.cli.simulate import DEFAULT_SYSTEMS, simulate_systems
from entrain.core.errors import ConfigError

TOLERANCE = 0.005
"""A system more than this fraction slower than its baseline is a regression."""
ITERATIONS = 3
"""Global batches per case (the workload zoo's). The full run (29 simulate runs, one process) took
36 min on the shared 2-core machine (2157 s; video, mixture and docvqa 150-370 s each, the paper's
cases 11-45 s): more iterations would make it impractical to run before every merge."""
SEED = 0
"""Both reports' seed (``bench paper``'s default, the zoo's ``simulate`` default)."""
HEADLINE = ("synthchartnet", "qwen25vl-llama3-1b", "a40-paper", 3, 5)
"""Issue 21's headline command: dataset, model, hardware, seed, iterations."""
RESULTS = Path(__file__).parent / "results"
BASELINE = RESULTS / "regression_baseline.json"
REPORT = RESULTS / "regression.md"
SHORT = zoo.MODELS
"""Model -> "1B" / "3B" (the zoo's labels)."""


def case_key(dataset: str, model: str, hardware: str, seed: int) -> str:
    return f"{dataset}/{SHORT[model]}/{hardware}/seed{seed}"


def argv(dataset: str, model: str, hardware: str, seed: int, iterations: int) -> list[str]:
    """``entrain simulate``'s arguments for a case, the paper's setup (``bench paper``'s constants)."""
    return ["simulate", "--dataset", dataset, "--model", model, "--hardware", hardware,
            "--gpus", str(paper.GPUS), "--dp", str(paper.DP), "--tp", str(paper.TP),
            "--global-batch", str(paper.GLOBAL_BATCH), "--microbatch-size", str(paper.MICROBATCH),
            "--iterations", str(iterations), "--seed", str(seed)]  # fmt: skip


def cases(iterations: int = ITERATIONS, seed: int = SEED) -> dict[str, dict]:
    """Every case: its argv, systems and the lists it belongs to ("paper", "zoo", "headline")."""
    out: dict[str, dict] = {}

    def add(dataset, model, hardware, systems, tag, case_seed=seed, case_iterations=iterations):
        key = case_key(dataset, model, hardware, case_seed)
        case = out.setdefault(key, {"argv": argv(dataset, model, hardware, case_seed, case_iterations),
                                    "systems": [], "lists": []})  # fmt: skip
        case["systems"] += [s for s in systems if s not in case["systems"]]
        case["lists"].append(tag)

    for hardware in paper.HARDWARE:
        for model in paper.MODELS:
            for dataset in paper.DATASETS:
                add(dataset, model, hardware, paper.SYSTEMS, "paper")
    for model in zoo.PAPER_MODELS:  # the whole-model 7B rows are not in the baseline yet
        for dataset in (*zoo.ZOO, *zoo.PAPER):
            add(dataset, model, "a40-paper", zoo.SYSTEMS, "zoo")
    dataset, model, hardware, h_seed, h_iterations = HEADLINE
    add(dataset, model, hardware, DEFAULT_SYSTEMS.split(","), "headline", h_seed, h_iterations)
    return out


def run_case(case: dict, systems=None) -> dict:
    """``{system: {"iteration_time_ms", "fits_memory", "source"}}`` of one case (``systems``: a subset);
    ``source`` (how the configuration was chosen, e.g. Entrain's layout decision) is for diagnosis only."""
    args = build_parser().parse_args(case["argv"])
    t0 = time.perf_counter()
    try:
        runs, configs = simulate_systems(args, list(systems or case["systems"]))
    except ConfigError as err:
        return {"error": str(err), "wall_s": time.perf_counter() - t0}
    got = {n: {"iteration_time_ms": r.metrics.iteration_time_ms, "fits_memory": r.metrics.fits_memory,
               "source": configs[n]["source"]} for n, r in runs.items()}  # fmt: skip
    return {"systems": got, "wall_s": time.perf_counter() - t0}


def _git_head() -> str:
    if os.environ.get("REGRESSION_COMMIT"):
        return os.environ["REGRESSION_COMMIT"]  # a run from an exported copy of a commit (no .git)
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=Path(__file__).parent).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def run_all(selected: dict[str, dict], log=print) -> dict:
    results = {}
    t0 = time.perf_counter()
    for i, (key, case) in enumerate(selected.items(), start=1):
        results[key] = {**case, **run_case(case)}
        log(f"regression: [{i}/{len(selected)}] {key}: {_entrain_line(results[key])} "
            f"({results[key]['wall_s']:.0f} s)")  # fmt: skip
    return {"commit": _git_head(), "wall_s": time.perf_counter() - t0, "cases": results}


def _entrain_line(res: dict) -> str:
    if "error" in res:
        return f"error: {res['error']}"
    me = res["systems"].get("entrain")
    return "no entrain" if me is None else f"entrain {me['iteration_time_ms']:.1f} ms"


# --- comparing -----------------------------------------------------------------------------------------
def compare_system(
    key: str, system: str, base: dict | None, cur: dict | None, tol: float = TOLERANCE
) -> dict:
    """One row: baseline ms, current ms, ratio and the verdict ("ok", "slower", "faster", "lost fit",
    "missing")."""
    row = {"case": key, "system": system, "baseline_ms": None, "current_ms": None, "ratio": None}
    if base is None or cur is None:
        return {**row, "verdict": "missing" if cur is None else "new"}
    b, c = base["iteration_time_ms"], cur["iteration_time_ms"]
    row.update(baseline_ms=b, current_ms=c, ratio=c / b if b > 0 else None)
    if base.get("fits_memory") is not False and cur.get("fits_memory") is False:
        return {**row, "verdict": "lost fit"}
    if c > b * (1.0 + tol):
        return {**row, "verdict": "slower"}
    if c < b * (1.0 - tol):
        return {**row, "verdict": "faster"}
    return {**row, "verdict": "ok"}


def compare(baseline: dict, current: dict, tol: float = TOLERANCE) -> list[dict]:
    """Every (case, system) row of the cases ``current`` ran, baseline beside current."""
    rows = []
    for key, cur in current["cases"].items():
        base = baseline["cases"].get(key)
        if base is None or "error" in base or "error" in cur:
            same = base is not None and base.get("error") == cur.get("error")
            rows.append({"case": key, "system": "-", "baseline_ms": None, "current_ms": None, "ratio": None,
                         "verdict": "ok" if same else "missing"})  # fmt: skip
            continue
        names = list(base["systems"]) + [n for n in cur["systems"] if n not in base["systems"]]
        for n in names:
            rows.append(compare_system(key, n, base["systems"].get(n), cur["systems"].get(n), tol))
    return rows


FAILS = ("slower", "lost fit", "missing")


def exit_status(rows: list[dict]) -> int:
    """1: Entrain slower (or anything missing); 2: only other systems slower / lost fit; 0: none."""
    bad = [r for r in rows if r["verdict"] in FAILS]
    if any(r["system"] in ("entrain", "-") or r["verdict"] == "missing" for r in bad):
        return 1
    return 2 if bad else 0


# --- the report -------------------------------------------------------------------------------------------
def _ms(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def render(baseline: dict, current: dict, rows: list[dict], status: int, note: str = "") -> str:
    s = baseline["settings"]
    flagged = [r for r in rows if r["verdict"] != "ok"]
    verdict = {0: "PASS", 1: "FAIL (Entrain slower, or a case missing)", 2: "FAIL (a baseline system slower)"}
    lines = [
        "# Regression guard: simulated iteration times against the baseline", "",
        f"Generated by `python benchmarks/regression.py` at {current['commit']} (wall time "
        f"{current['wall_s']:.0f} s, {len(current['cases'])} case(s)) against "
        f"`benchmarks/results/regression_baseline.json` recorded at {baseline['commit']}. Settings: "
        f"{s['iterations']} iteration(s) per case, seed {s['seed']} (headline: its own command), "
        f"tolerance {TOLERANCE:.1%}; each case's exact `entrain simulate` argv is in the baseline file.", "",
        f"**Verdict: {verdict[status]}.** ratio = current / baseline (> 1: slower).", "",
    ]  # fmt: skip
    if baseline.get("why"):
        lines += [f"Why the baseline is what it is: {baseline['why']}", ""]
    if note:
        lines += ["## About this run", "", note, ""]
    lines += ["## Changed beyond the tolerance", ""]
    lines += _table(flagged) if flagged else ["- none"]
    changed = sorted({r["case"] for r in flagged})
    if changed:
        lines += ["", "Entrain's configuration now (`source`) on the changed cases:", ""]
        lines += [f"- {k}: {_entrain_source(current, k)}" for k in changed]
    lines += ["", "## Every case and system", ""] + _table(rows)
    return "\n".join(lines) + "\n"


def _entrain_source(run: dict, key: str) -> str:
    return run["cases"][key].get("systems", {}).get("entrain", {}).get("source", "-")


def _table(rows: list[dict]) -> list[str]:
    out = ["| case | system | baseline ms | current ms | ratio | verdict |", "|---|---|---:|---:|---:|---|"]
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.4f}"
        out.append(f"| {r['case']} | {r['system']} | {_ms(r['baseline_ms'])} | {_ms(r['current_ms'])} | "
                   f"{ratio} | {r['verdict']} |")  # fmt: skip
    return out


# --- command line ------------------------------------------------------------------------------------------
def load_baseline(path: Path = BASELINE) -> dict:
    with open(path) as f:
        return json.load(f)


def _settings(iterations: int, seed: int) -> dict:
    return {"iterations": iterations, "seed": seed, "headline": dict(zip(
        ("dataset", "model", "hardware", "seed", "iterations"), HEADLINE)), "tolerance": TOLERANCE,
        "cpu_count": os.cpu_count()}  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--update", action="store_true", help="rewrite the baseline from a fresh run")
    p.add_argument("--from", dest="from_run", type=Path, default=None, metavar="JSON",
                   help="take the run a comparison wrote (regression.json) instead of running: with --update "
                        "it becomes the baseline, else it is compared again (the report re-rendered)")  # fmt: skip
    p.add_argument("--why", default="", help="with --update (required): why the baseline changes, kept in it")
    p.add_argument("--note", default="", help="a paragraph for the report's 'About this run'")
    p.add_argument("--case", action="append", default=None, help="only this case key (repeatable)")
    p.add_argument("--baseline", type=Path, default=BASELINE)
    p.add_argument("--out", type=Path, default=REPORT,
                   help="the markdown report of a comparison; the fresh run goes to the same path with .json")  # fmt: skip
    return p


def complete_run(run: dict) -> dict:
    """``run`` (a comparison's .json) when it holds every case of its settings with today's argv."""
    s = run["settings"]
    want = {k: c["argv"] for k, c in cases(s["iterations"], s["seed"]).items()}
    got = {k: c["argv"] for k, c in run["cases"].items()}
    if got != want:
        raise SystemExit(
            f"regression: the run holds {len(got)} case(s), not today's {len(want)} with the same argv"
        )
    return run


def _write_baseline(path: Path, run: dict, log) -> int:
    path.write_text(json.dumps(run, indent=1) + "\n")
    log(f"regression: wrote {path} (run at {run['commit']}, {run['wall_s']:.0f} s)")
    return 0


def main(argv_: list[str] | None = None) -> int:
    args = _parser().parse_args(argv_)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if args.update and args.case:
        raise SystemExit("regression: --update rewrites the whole baseline; drop --case")
    if args.update and not args.why:
        raise SystemExit(
            "regression: --update needs --why TEXT (kept in the baseline; say it in the commit too)"
        )
    if args.update and args.from_run:
        return _write_baseline(
            args.baseline, {**complete_run(load_baseline(args.from_run)), "why": args.why}, log
        )
    base = None if args.update else load_baseline(args.baseline)
    settings = base["settings"] if base else _settings(ITERATIONS, SEED)
    every = cases(settings["iterations"], settings["seed"])
    unknown = [k for k in args.case or () if k not in every]
    if unknown:
        raise SystemExit(f"regression: unknown case(s) {', '.join(unknown)}; choose from {', '.join(every)}")
    selected = {k: every[k] for k in args.case} if args.case else every
    if args.from_run:
        current = load_baseline(args.from_run)
    else:
        current = {"settings": settings, **run_all(selected, log)}
    if args.update:
        return _write_baseline(args.baseline, {**current, "why": args.why}, log)
    rows = compare(base, current)
    status = exit_status(rows)
    args.out.write_text(render(base, current, rows, status, args.note))
    if not args.from_run:
        args.out.with_suffix(".json").write_text(json.dumps(current, indent=1) + "\n")
    for r in (r for r in rows if r["verdict"] != "ok"):
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.4f}"
        print(f"{r['verdict']:>8}  {r['case']:<40} {r['system']:<16} {_ms(r['baseline_ms']):>10} -> "
              f"{_ms(r['current_ms']):>10}  ({ratio})")  # fmt: skip
    log(f"regression: wrote {args.out} and its .json; exit {status}")
    return status


if __name__ == "__main__":
    sys.exit(main())
