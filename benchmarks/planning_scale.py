"""Planning at scale: wall time and peak resident memory of ``entrain plan`` on large workload files.

Writes a seeded workload JSONL (0-4 images of 224-1024 px a side per sample, 20-2000 text tokens) of
100K and 1M samples into a temporary folder (never into the repository) and times
``entrain plan --model qwen25vl-llama3-1b --global-batch 8192 --microbatch-size 4 --tp 2`` on 64, 256,
1024 and 4096 GPUs (``dp = gpus / 16``: 16 GPUs per replica, as the paper's setups) under
``/usr/bin/time -v`` (wall clock, maximum resident set size). ``--profile`` adds a cProfile of one
run (top functions by own time and by cumulative time) so the table says where the time goes.

    python benchmarks/planning_scale.py [--sizes 100000,1000000] [--gpus 64,256,1024,4096]
        [--profile 100000:1024] [--out benchmarks/results/planning_scale.md]

Just the target cell (1M samples x 1024 GPUs; an idle machine for the wall time), without cProfile,
into a scratch report:

    python benchmarks/planning_scale.py --sizes 1000000 --gpus 1024 --profile '' --out cell.md

``--phases SIZE:GPUS`` prints the CPU seconds per phase (reading, Algorithms 1 + 2, the judge and its
DP split, the memory check) of one in-process run (``--jobs`` workers' CPU included).

The machine is a shared 2-core CPU: the load average before and after each run is recorded.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from provenance import source, stamped  # benchmarks/provenance.py (scripts run from this folder)

MODEL, GLOBAL_BATCH, MICROBATCH, TP, GPUS_PER_REPLICA = "qwen25vl-llama3-1b", 8192, 4, 2, 16
TARGET_WALL_S, TARGET_RSS_GB = 60.0, 1.5


def write_workload(path: str | Path, num_samples: int, seed: int = 0, chunk: int = 100_000) -> None:
    """``num_samples`` workload records: 0-4 images of 224-1024 px a side, 20-2000 text tokens."""
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for start in range(0, num_samples, chunk):
            n = min(chunk, num_samples - start)
            counts, text = rng.integers(0, 5, n), rng.integers(20, 2001, n)
            sides = rng.integers(224, 1025, (n, 4, 2)).tolist()
            lines = []
            for i in range(n):
                images = ",".join(f"[{h},{w}]" for h, w in sides[i][: counts[i]])
                lines.append(f'{{"id":"s{start + i}","images":[{images}],"text_tokens":{int(text[i])}}}\n')
            f.writelines(lines)


def plan_args(path: str, gpus: int) -> list[str]:
    return [
        "plan", "--dataset", path, "--gpus", str(gpus), "--dp", str(gpus // GPUS_PER_REPLICA), "--tp", str(TP),
        "--global-batch", str(GLOBAL_BATCH), "--microbatch-size", str(MICROBATCH), "--model", MODEL, "--json",
    ]  # fmt: skip


def _time_field(text: str, label: str) -> str:
    m = re.search(rf"{re.escape(label)}: (.+)", text)
    return m.group(1).strip() if m else ""


def _wall_s(text: str) -> float:
    parts = [float(x) for x in _time_field(text, "Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    return sum(p * 60**i for i, p in enumerate(reversed(parts)))


def timed_plan(path: str, gpus: int) -> dict:
    """One ``entrain plan`` under ``/usr/bin/time -v``: wall s, peak RSS GB, the plan's key fields."""
    load_before = os.getloadavg()[0]
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "entrain", *plan_args(path, gpus)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"entrain plan failed ({proc.returncode}): {proc.stderr[-2000:]}")
    obj = json.loads(proc.stdout)
    rss_kb = float(_time_field(proc.stderr, "Maximum resident set size (kbytes)"))
    cpu_s = sum(float(_time_field(proc.stderr, f"{k} time (seconds)")) for k in ("User", "System"))
    return {
        "gpus": gpus, "dp": gpus // GPUS_PER_REPLICA, "wall_s": _wall_s(proc.stderr), "cpu_s": cpu_s, "rss_gb": rss_kb / 1e6,
        "load_before": load_before, "load_after": os.getloadavg()[0], "plan": plan_summary(obj),
    }  # fmt: skip


def plan_summary(obj: dict) -> dict:
    """What decides the plan: b_min, the stages and layer ranges, Eq. 2 and the deployed layout."""
    comps = obj["config"]["components"]
    return {
        "b_min": obj["b_min"],
        "converged": obj["converged"],
        "stages": {c: [comps[c]["tp"], comps[c]["pp"], comps[c]["layers_per_stage"]] for c in comps},
        "predicted_iteration_time_ms": obj["predicted_iteration_time_ms"],
        "layout": obj.get("layout"),
        "fits_memory": obj.get("fits_memory"),
    }


def profile_plan(path: str, gpus: int, top: int = 20) -> dict[str, str]:
    """cProfile of one in-process ``entrain plan`` run: the top functions by own and by cumulative time."""
    from entrain.cli.main import main

    prof = cProfile.Profile()
    sink = io.StringIO()
    stdout, sys.stdout = sys.stdout, sink
    try:
        prof.runcall(main, plan_args(path, gpus))
    finally:
        sys.stdout = stdout
    return profile_tables(prof, top)


def profile_tables(prof, top: int = 20) -> dict[str, str]:
    """The top functions by own and by cumulative time of a profile (or a saved cProfile file)."""
    out = {}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(top)
        out[key] = buf.getvalue().split("\n", 4)[-1].strip()  # from the column header on
    return out


PHASES = (
    ("reading", "entrain.cli.plan", "config_sampler"),
    ("Algorithm 1 + 2", "entrain.cli.plan", "plan"),
    ("setup", "entrain.cli.plan", "entrain_setup"),
    ("decision judge", "entrain.sim.choose", "judged_ms"),
    ("judge's DP split", "entrain.sim.choose", "heaviest_replicas"),
    ("memory check batches", "entrain.cli.plan", "_check_batches"),
    ("deploy memory check", "entrain.cli.plan", "deploy"),
)
"""(phase, module, function) timed by ``--phases`` (the DP split is inside the judge)."""


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the ``--jobs`` workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def phase_cpu_s(path: str, gpus: int, jobs: int) -> dict[str, float]:
    """CPU seconds per ``PHASES`` entry of one in-process ``entrain plan --jobs jobs``, and the total."""
    import importlib

    from entrain.cli.main import main

    spent = dict.fromkeys([p[0] for p in PHASES], 0.0)
    saved = []
    for name, module, fn in PHASES:
        mod = importlib.import_module(module)
        orig = getattr(mod, fn)

        def timed(*a, _orig=orig, _name=name, **k):
            t0 = _cpu_s()
            try:
                return _orig(*a, **k)
            finally:
                spent[_name] += _cpu_s() - t0

        saved.append((mod, fn, orig))
        setattr(mod, fn, timed)
    t0, stdout, sys.stdout = _cpu_s(), sys.stdout, io.StringIO()
    try:
        main([*plan_args(path, gpus), "--jobs", str(jobs)])
    finally:
        sys.stdout = stdout
        for mod, fn, orig in saved:
            setattr(mod, fn, orig)
    return {**spent, "total": _cpu_s() - t0}


def _row(size: int, r: dict) -> str:
    p = r["plan"]
    met = "yes" if r["wall_s"] <= TARGET_WALL_S and r["rss_gb"] <= TARGET_RSS_GB else "no"
    stages = ", ".join(f"{c} tp{v[0]} pp{v[1]}" for c, v in p["stages"].items())
    return (
        f"| {size:,} | {r['gpus']} | {r['dp']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['rss_gb']:.2f} | {met} | {p['b_min']} | "
        f"{stages} | {p['predicted_iteration_time_ms']:.1f} | {r['load_before']:.1f} / {r['load_after']:.1f} |"
    )


def write_report(out: Path, results: dict, profiles: list[dict], notes: list[str], src: dict) -> None:
    lines = [
        "# Planning at scale (`entrain plan` on large workload files)",
        "",
        f"`python benchmarks/planning_scale.py`: seeded workload JSONL (0-4 images of 224-1024 px a side, "
        f"20-2000 text tokens), `--model {MODEL} --global-batch {GLOBAL_BATCH} --microbatch-size {MICROBATCH} "
        f"--tp {TP} --dp gpus/{GPUS_PER_REPLICA}`; wall time and peak RSS from `/usr/bin/time -v`. Target"
        f": at most {TARGET_WALL_S:.0f} s and {TARGET_RSS_GB} GB. Shared 2-core machine: "
        "the 1-minute load average before / after each run is listed.",
        "",
        "| samples | GPUs | dp | wall s | CPU s | peak RSS GB | target met | b_min | stages | Eq. 2 ms | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(int(size), r) for size, runs in results.items() for r in runs]
    lines += ["", *notes]
    for profile in profiles:
        lines += ["", f"## Where the time goes ({profile['what']})", ""]
        for key, title in (("tottime", "own time"), ("cumulative", "cumulative time")):
            lines += [f"Top functions by {title}:", "", "```", profile[key], "```", ""]
    out.write_text(stamped("\n".join(lines) + "\n", src))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--gpus", default="64,256,1024,4096")
    ap.add_argument("--profile", default="100000:1024", help="SIZE:GPUS of the cProfile run ('' = none)")
    ap.add_argument("--out", default="benchmarks/results/planning_scale.md")
    ap.add_argument(
        "--phases", default="", help="SIZE:GPUS: print CPU s per phase of one run, run nothing else"
    )
    ap.add_argument("--jobs", type=int, default=2, help="entrain plan --jobs of the --phases run")
    ap.add_argument("--note", action="append", default=[], help="a line added under the table")
    ap.add_argument("--from-json", default="", help="results JSON of an earlier run to render (runs nothing)")
    ap.add_argument(
        "--profile-file",
        default="",
        help="WHAT=FILE: also summarise a saved cProfile (e.g. of the code before)",
    )
    args = ap.parse_args()
    if args.phases:
        size, gpus = (int(x) for x in args.phases.split(":"))
        with tempfile.TemporaryDirectory(prefix="planning_scale_") as tmp:
            path = os.path.join(tmp, f"workload_{size}.jsonl")
            write_workload(path, size)
            print(json.dumps({"samples": size, "gpus": gpus, **phase_cpu_s(path, gpus, args.jobs)}))
        return
    sizes = [int(x) for x in args.sizes.split(",") if x]
    gpus_list = [int(x) for x in args.gpus.split(",") if x]
    results: dict[int, list[dict]] = {}
    profile, recorded = None, None
    if args.from_json:  # render earlier runs (plus --profile-file) without running them again
        recorded = json.loads(Path(args.from_json).read_text())
        results = {int(k): v for k, v in recorded["results"].items()}
        sizes = []
    with tempfile.TemporaryDirectory(prefix="planning_scale_") as tmp:
        for size in sizes:
            path = os.path.join(tmp, f"workload_{size}.jsonl")
            t0 = time.perf_counter()
            write_workload(path, size)
            print(f"wrote {size} samples in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            results[size] = []
            for gpus in gpus_list:
                results[size].append(timed_plan(path, gpus))
                print(json.dumps({"samples": size, **results[size][-1]}), file=sys.stderr)
            if args.profile and int(args.profile.split(":")[0]) == size:
                gpus = int(args.profile.split(":")[1])
                profile = {"what": f"cProfile, {size:,} samples, {gpus} GPUs", **profile_plan(path, gpus)}
    profiles = [profile] if profile else []
    if args.profile_file:
        what, file = args.profile_file.split("=", 1)
        profiles.append({"what": what, **profile_tables(file)})
    out, src = Path(args.out), source(recorded)
    write_report(out, results, profiles, args.note, src)
    out.with_suffix(".json").write_text(
        json.dumps({"source": src, "results": results, "profiles": profiles}, indent=1) + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
