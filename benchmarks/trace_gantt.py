"""The Gantt of a real CPU run beside the simulated Gantt of the same Plan.

Runs the CPU benchmark's configuration (``cpu_pipeline.CONFIG``: the tiny VLM on ``skewed``, 1
encoder + 1 LLM stage on 2 processes) with ``entrain train --trace`` for Entrain and for 1F1B, then
``entrain plot-trace`` on each run's last step. Writes ``docs/trace_gantt_<system>.png`` and
``benchmarks/results/trace_gantt.json`` (the commit and command, real and simulated iteration times,
CPU idle fraction measured before the runs).

    flock /tmp/entrain-bench.lock python benchmarks/trace_gantt.py [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from cpu_pipeline import CONFIG, RESULTS, wait_idle  # benchmarks/ (scripts run from this folder)

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
SYSTEMS = ("entrain", "1f1b")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-idle-wait-s", type=float, default=120.0)
    args = ap.parse_args()
    idle, fraction = wait_idle(args.max_idle_wait_s)
    out = tempfile.mkdtemp(prefix="entrain-trace-")
    cmd = [sys.executable, "-m", "entrain", "train", "--system", ",".join(SYSTEMS), "--steps", str(args.steps),
           "--out", out, "--no-progress", "--nproc", "2", "--trace"]  # fmt: skip
    for key, value in CONFIG.items():
        cmd += ["--" + key.replace("_", "-"), str(value)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    results = {
        "source": {
            "commit": head.stdout.strip(),
            "command": f"python benchmarks/trace_gantt.py --steps {args.steps}",
        },
        "cpu_idle_before": round(fraction, 3),
        "idle_check_passed": idle,
        "steps": args.steps,
        "runs": {},
    }
    for system in SYSTEMS:
        png = os.path.join(DOCS, f"trace_gantt_{system}.png")
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "entrain",
                "plot-trace",
                os.path.join(out, system),
                "--out",
                png,
                "--json",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        results["runs"][system] = json.loads(r.stdout)
        results["runs"][system]["out"] = os.path.relpath(png, os.path.dirname(DOCS))
    with open(os.path.join(RESULTS, "trace_gantt.json"), "w") as f:
        json.dump(results, f, indent=1)
    for system, r in results["runs"].items():
        print(
            f"{system}: step {r['step']} real {r['real_ms']:.0f} ms, simulated {r['simulated_ms']:.0f} ms -> {r['out']}"
        )
    print(f"CPU idle before the runs: {fraction:.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
