"""Regression guard: every system's simulated iteration time on the paper's 16 cases, the workload
zoo's 20 and the paper's headline command, against a committed baseline.

    python benchmarks/regression.py                 # compare a fresh run with the baseline, write the report
    python benchmarks/regression.py --rebaseline --why TEXT   # rewrite the baseline (its own commit, saying why)
    python benchmarks/regression.py --rebaseline --why TEXT --from benchmarks/results/regression.json  # the last run
    python benchmarks/regression.py --from benchmarks/results/regression.json --note TEXT  # re-render the report
    python benchmarks/regression.py --case synthchartnet/1B/a40-paper/seed0   # some cases only

The cases are imported, never retyped: ``entrain bench paper``'s datasets x models x hardware presets
(``entrain.cli.bench``) and ``benchmarks/workload_zoo.py``'s workloads x models (a40-paper). The
8 cases both lists hold (the paper's datasets on a40-paper) run once and count for both. Every case
runs ``entrain simulate``'s path (``cli.simulate.simulate_systems``: each system with the
configuration its own method picks, the simulated memory check included) with the settings the
baseline records (``settings``: iterations, seed, the exact argv), so a run is comparable.
``headline`` is the headline speed-up command itself (synthchartnet, 1B, a40-paper) (seed 3, 5 iterations, simulate's default systems).

Verdict (exit status): 1 when Entrain (``entrain``) is more than ``TOLERANCE`` slower than its
baseline on any case, or a case/system of the baseline is missing or fails; 2 when only other
systems got slower than ``TOLERANCE`` or lost their memory fit. A baseline system that gets slower
makes Entrain look better, so it fails too (exit 2 tells it apart): either the slowdown is a bug,
or it is intended and the baseline is rewritten (``--rebaseline``, alias ``--update``) in a commit of
its own that says why: it is refused while tracked files other than the baseline's differ from HEAD,
prints every row that moves (any change, within the tolerance too) and writes them into the proposed
commit message (``benchmarks/results/REBASELINE_MSG.txt``); the report (``--out``) is then re-rendered
against the new baseline, to be committed after the baseline's own commit.

Every run also lists the results files older than the code they measure (``stale_results``: a file
whose ``Source: commit X`` line, or JSON ``commit``, is older than a commit to ``entrain/core`` or
``entrain/sim``), printed and in the run's JSON. Any system faster by more than ``TOLERANCE`` is listed (not a failure: a faster baseline makes
Entrain look worse, nothing is hidden). 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
"""the headline command: dataset, model, hardware, seed, iterations."""
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
        head = _git(["rev-parse", "--short", "HEAD"], ROOT).strip()
        dirty = uncommitted_outside()  # the regression's own results files do not make a run dirty
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
    row.update(baseline_ms=b, current_ms=c, ratio=c / b if b > 0 else None,
               baseline_fits=base.get("fits_memory"), current_fits=cur.get("fits_memory"))  # fmt: skip
    if base.get("fits_memory") is not False and cur.get("fits_memory") is False:
        return {**row, "verdict": "lost fit"}
    if c > b * (1.0 + tol):
        return {**row, "verdict": "slower"}
    if c < b * (1.0 - tol):
        return {**row, "verdict": "faster"}
    return {**row, "verdict": "ok"}


def error_verdict(base: dict | None, cur: dict) -> str:
    """A case where the baseline lacks it or either run failed: "ok" only when both hold the same error
    (a case that fails as it always did); "missing" otherwise (absent from the baseline, newly failing,
    or failing no more: each needs a look, and a rebaseline)."""
    same = base is not None and base.get("error") == cur.get("error")
    return "ok" if same else "missing"


def compare_case(key: str, base: dict | None, cur: dict, tol: float = TOLERANCE) -> list[dict]:
    """One case's rows: one ``system "-"`` row (``error_verdict``) when the baseline lacks the case or
    either run holds an error, else one row a system (the baseline's, then any new), ``compare_system``."""
    if base is None or "error" in base or "error" in cur:
        return [{"case": key, "system": "-", "baseline_ms": None, "current_ms": None, "ratio": None,
                 "verdict": error_verdict(base, cur)}]  # fmt: skip
    names = list(base["systems"]) + [n for n in cur["systems"] if n not in base["systems"]]
    return [compare_system(key, n, base["systems"].get(n), cur["systems"].get(n), tol) for n in names]


def compare(baseline: dict, current: dict, tol: float = TOLERANCE) -> list[dict]:
    """Every (case, system) row of the cases ``current`` ran, baseline beside current."""
    return [row for key, cur in current["cases"].items()
            for row in compare_case(key, baseline["cases"].get(key), cur, tol)]  # fmt: skip


def row_moved(row: dict) -> bool:
    """Whether a row differs from its baseline at all (any change of time, a case or system present on one
    side only, or an error that differs): what a rebaseline changes, tolerance or not."""
    if row["system"] == "-":
        return row["verdict"] != "ok"
    if row["verdict"] in ("missing", "new"):
        return True
    return row["current_ms"] != row["baseline_ms"] or row.get("current_fits") != row.get("baseline_fits")


FAILS = ("slower", "lost fit", "missing")


def exit_status(rows: list[dict]) -> int:
    """1: Entrain slower (or anything missing); 2: only other systems slower / lost fit; 0: none."""
    bad = [r for r in rows if r["verdict"] in FAILS]
    if any(r["system"] in ("entrain", "-") or r["verdict"] == "missing" for r in bad):
        return 1
    return 2 if bad else 0


# --- rebaselining: the rows that move, and never in a commit with code -------------------------------------
ROOT = Path(__file__).resolve().parents[1]
REBASELINE_MSG = RESULTS / "REBASELINE_MSG.txt"
REBASELINE_FREE = tuple(f"benchmarks/results/{n}" for n in (
    "regression_baseline.json", "regression.md", "regression.json", "REBASELINE_MSG.txt"))  # fmt: skip
"""The paths a rebaseline may find changed (the baseline, the report it comes from, its message)."""
MEASURED_CODE = ("entrain", "benchmarks/regression.py", "benchmarks/workload_zoo.py")
"""What a regression run measures: a run whose commit is older than a change here is not today's."""


def _git(args: list[str], repo: Path) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def uncommitted_outside(allowed: tuple[str, ...] = REBASELINE_FREE, repo: Path = ROOT) -> list[str]:
    """Tracked paths (repo-relative) whose working-tree or staged content differs from HEAD, other than
    ``allowed``: a baseline recorded with any of them would mix code and baseline in one commit."""
    changed = _git(["diff", "--name-only", "HEAD", "--"], repo).split("\n")
    return sorted(p for p in changed if p and p not in allowed)


def commits_since(commit: str, paths: tuple[str, ...], repo: Path = ROOT) -> list[str] | None:
    """Short hashes of the commits after ``commit`` (to HEAD) that touch ``paths``; None when ``commit``
    is no commit of this repository."""
    try:
        _git(["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], repo)
    except subprocess.CalledProcessError:
        return None
    return _git(["log", "--format=%h", f"{commit}..HEAD", "--", *paths], repo).split()


def rebaseline_refusal(run: dict, repo: Path = ROOT) -> str | None:
    """Why a run must not become the baseline (None: it may): uncommitted changes outside the baseline's
    files, a run on a dirty or unknown tree, or code changed since the run's commit."""
    dirty = uncommitted_outside(repo=repo)
    if dirty:
        return ("uncommitted changes outside the baseline: " + ", ".join(dirty) +
                " (commit them first: a baseline changes in a commit of its own, never with code)")  # fmt: skip
    commit = str(run.get("commit", "unknown"))
    if commit.endswith("+dirty") or commit == "unknown":
        return f"the run was taken at {commit}, not at a commit: re-run on a clean tree"
    since = commits_since(commit, MEASURED_CODE, repo)
    if since is None:
        return f"the run's commit {commit} is not in this repository"
    if since:
        return f"the run at {commit} is older than the code: {', '.join(since)} changed it since; re-run"
    return None


def _exact_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def moved_line(r: dict) -> str:
    ratio = "-" if r["ratio"] is None else f"{r['ratio']:.6f}"
    return (f"{r['case']} {r['system']}: {_exact_ms(r['baseline_ms'])} -> {_exact_ms(r['current_ms'])} ms "
            f"(ratio {ratio}, {r['verdict']})")  # fmt: skip


def rebaseline_message(old: dict, run: dict, why: str) -> tuple[list[dict], str]:
    """The rows that move from ``old`` to ``run`` (``row_moved``: every change, within the tolerance or not)
    and a commit message naming each (case, system, old, new, ratio) and counting the rows that do not."""
    rows = compare(old, run)
    moved = [r for r in rows if row_moved(r)]
    gone = [k for k in old["cases"] if k not in run["cases"]]
    head = f"regression baseline re-recorded at {run['commit']}: {len(moved)} of {len(rows)} rows move"
    lines = [head, "", f"Why: {why}", "", f"Old baseline recorded at {old.get('commit', 'unknown')}.", ""]
    lines += ["Rows that move (case system: old -> new ms, ratio new/old, verdict):", ""]
    lines += [f"- {moved_line(r)}" for r in moved] or ["- none"]
    lines += [f"- {k}: in the old baseline, not in the run" for k in gone]
    lines += ["", f"Every other row ({len(rows) - len(moved)}) is identical to the old baseline."]
    return moved, "\n".join(lines) + "\n"


def rebaseline(
    path: Path, old: dict, run: dict, why: str, log, repo: Path = ROOT, msg_path: Path = REBASELINE_MSG
) -> int:
    """Write ``run`` as the baseline at ``path`` (``old``: the one it replaces) after ``rebaseline_refusal``;
    print every moved row and write the proposed commit message to ``msg_path`` (exit 3 when refused)."""
    refusal = rebaseline_refusal(run, repo)
    if refusal:
        log(f"regression: refusing to rebaseline: {refusal}")
        return 3
    moved, message = rebaseline_message(old, run, why)
    for r in moved:
        print(f"moved  {moved_line(r)}")
    msg_path.write_text(message)
    _write_baseline(path, {k: v for k, v in run.items() if k != "stale_results"} | {"why": why}, log)
    rel = lambda p: os.path.relpath(p, repo)  # noqa: E731
    log(f"regression: {len(moved)} row(s) move; commit the baseline alone with: "
        f"git commit -F {rel(msg_path)} -- {rel(path)}")  # fmt: skip
    return 0


# --- stale results: a results file older than the code it measures -------------------------------------
SIMULATED_CODE = ("entrain/core", "entrain/sim")
"""The code the simulated results measure: a commit here after the one a results file names makes it stale."""
SOURCE_COMMIT = re.compile(r"Source: commit ([0-9a-f]{7,40})\b")
NOT_STALE = ("regression_baseline.json",)
"""The baseline is older than the code by design: the comparison is what measures it."""


def named_commits(path: Path) -> list[str]:
    """The commits a results file says it came from: each ``Source: commit X`` line (markdown) or its
    top-level ``commit`` (JSON, ``+dirty`` dropped)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".json":
        return list(dict.fromkeys(SOURCE_COMMIT.findall(text)))
    try:
        commit = json.loads(text).get("commit")
    except (ValueError, AttributeError):
        return []
    commit = str(commit or "").split("+")[0]
    return [commit] if re.fullmatch(r"[0-9a-f]{7,40}", commit) else []


def stale_results(
    results: Path = RESULTS, repo: Path = ROOT, code: tuple[str, ...] = SIMULATED_CODE
) -> list[dict]:
    """``{"file", "commit", "changed_by"}`` for each results file naming a commit older than a change to
    ``code`` (``changed_by``: those commits, newest first; ``None``: the commit is not in the repository);
    None outside a git checkout (an exported copy of a commit: nothing to compare with)."""
    if not (repo / ".git").exists():
        return None
    out = []
    for path in sorted(results.iterdir()):
        if path.suffix not in (".md", ".json") or path.name in NOT_STALE:
            continue
        for commit in named_commits(path):
            since = commits_since(commit, code, repo)
            if since is None or since:
                out.append({"file": os.path.relpath(path, repo), "commit": commit, "changed_by": since})
    return out


def stale_lines(stale: list[dict]) -> list[str]:
    """One line a stale file: how many commits changed the measured code since its commit, the newest three."""
    out = []
    for s in stale:
        since = s["changed_by"]
        why = ("not a commit of this repository" if since is None else
               f"{len(since)} commit(s) to {' or '.join(SIMULATED_CODE)} since (newest: {', '.join(since[:3])})")  # fmt: skip
        out.append(f"- {s['file']} (commit {s['commit']}): {why}")
    return out


# --- the report -------------------------------------------------------------------------------------------
def _ms(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def render(baseline: dict, current: dict, rows: list[dict], status: int, note: str = "") -> str:
    s = baseline["settings"]
    flagged = [r for r in rows if r["verdict"] != "ok"]
    verdict = {0: "PASS", 1: "FAIL (Entrain slower, or a case missing)", 2: "FAIL (a baseline system slower)"}
    commit = str(current["commit"])
    dirty = " (with uncommitted changes)" if commit.endswith("+dirty") else ""
    command = current.get("command", "python benchmarks/regression.py")
    lines = [
        "# Regression guard: simulated iteration times against the baseline", "",
        f"Source: commit {commit.split('+')[0]}, `{command}`{dirty}", "",
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
    stale = current.get("stale_results")
    if stale is not None:
        lines += ["", "## Results files older than the code they measure", ""]
        lines += stale_lines(stale) or ["- none"]
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
    p.add_argument("--rebaseline", "--update", dest="rebaseline", action="store_true",
                   help="rewrite the baseline from a fresh run (or --from): refused while the tree has uncommitted "
                        "changes outside it; prints every row that moves and writes the commit message to "
                        "benchmarks/results/REBASELINE_MSG.txt")  # fmt: skip
    p.add_argument("--from", dest="from_run", type=Path, default=None, metavar="JSON",
                   help="take the run a comparison wrote (regression.json) instead of running: with --rebaseline "
                        "it becomes the baseline, else it is compared again (the report re-rendered)")  # fmt: skip
    p.add_argument(
        "--why", default="", help="with --rebaseline (required): why the baseline changes, kept in it"
    )
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


def _check_rebaseline(args) -> None:
    if args.rebaseline and args.case:
        raise SystemExit("regression: --rebaseline rewrites the whole baseline; drop --case")
    if args.rebaseline and not args.why:
        raise SystemExit(
            "regression: --rebaseline needs --why TEXT (kept in the baseline and in its message)"
        )
    if args.rebaseline:
        refusal = rebaseline_refusal({"commit": _git_head()})
        if refusal:  # before a run of half an hour, not after it
            raise SystemExit(f"regression: refusing to rebaseline: {refusal}")


def _print_rows(rows: list[dict]) -> None:
    for r in (r for r in rows if r["verdict"] != "ok"):
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.4f}"
        print(f"{r['verdict']:>8}  {r['case']:<40} {r['system']:<16} {_ms(r['baseline_ms']):>10} -> "
              f"{_ms(r['current_ms']):>10}  ({ratio})")  # fmt: skip


def _write_report(args, base: dict, run: dict) -> tuple[list[dict], int]:
    """``run`` compared with ``base``, rendered to ``--out``; the rows and the exit status."""
    rows = compare(base, run)
    status = exit_status(rows)
    args.out.write_text(render(base, run, rows, status, args.note or run.get("note", "")))
    return rows, status


def _rerender(args, run: dict, log) -> int:
    """The report compared with the baseline just written (a report against the old one would say rows
    moved that the baseline now holds); it lands in a commit after the baseline's own."""
    _write_report(args, load_baseline(args.baseline), run)
    log(f"regression: re-rendered {args.out} against the new baseline; commit it after the baseline")
    return 0


def main(argv_: list[str] | None = None) -> int:
    args = _parser().parse_args(argv_)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    _check_rebaseline(args)
    if args.baseline.exists():
        base = load_baseline(args.baseline)
    else:  # the first recording
        base = {"settings": _settings(ITERATIONS, SEED), "commit": "none", "cases": {}}
    if args.rebaseline and args.from_run:
        run = complete_run(load_baseline(args.from_run))
        return rebaseline(args.baseline, base, run, args.why, log) or _rerender(args, run, log)
    settings = base["settings"]
    every = cases(settings["iterations"], settings["seed"])
    unknown = [k for k in args.case or () if k not in every]
    if unknown:
        raise SystemExit(f"regression: unknown case(s) {', '.join(unknown)}; choose from {', '.join(every)}")
    selected = {k: every[k] for k in args.case} if args.case else every
    if args.from_run:
        current = load_baseline(args.from_run)
    else:
        command = " ".join(
            ["python benchmarks/regression.py", *(argv_ if argv_ is not None else sys.argv[1:])]
        )
        current = {"settings": settings, **run_all(selected, log), "stale_results": stale_results(),
                   "command": command, "note": args.note}  # fmt: skip
    if args.rebaseline:
        return rebaseline(args.baseline, base, current, args.why, log) or _rerender(args, current, log)
    rows, status = _write_report(args, base, current)
    if not args.from_run:
        args.out.with_suffix(".json").write_text(json.dumps(current, indent=1) + "\n")
    _print_rows(rows)
    stale = current.get("stale_results")
    if stale is not None:
        print(f"stale results ({len(stale)}): older than a change to {' or '.join(SIMULATED_CODE)}")
        print("\n".join(stale_lines(stale)) or "- none")
    log(f"regression: wrote {args.out} and its .json; exit {status}")
    return status


if __name__ == "__main__":
    sys.exit(main())
