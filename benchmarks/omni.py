"""The omni preset (``qwen25-omni-7b``: Qwen2.5-Omni-7B's thinker, an audio tower beside the vision
tower) on the ``omni`` workload, side by side in one process on the same batches:

* the **N-encoder path** (what ``entrain simulate`` runs for this model): one pipeline per encoder,
  Entrain's plan and DistTrain-like's from ``plan_encoders_system``, recomputation fitted to memory
  (``entrain.sim.encoders_run``); the other systems are not built there (their one-line reasons listed);
* **today's one-encoder path** (``simulate(..., one_encoder=True)``): both towers as one encoder
  component (a clip's attention chunks priced as rows of the vision tower's layers,
  ``SampleMeta.encoder_units``), every system with its own search, memory fitting and extensions.

Ratios are each fitting baseline's iteration time over Entrain's (the N-encoder Entrain's, and the
one-encoder Entrain's for its own path). Setup: the workload zoo's (64 GPUs, DP 4, TP 2, global batch
512, microbatch size 4), seed 0.

    python benchmarks/omni.py [--hardware a40-flops,a40-paper] [--iterations 3] [--out benchmarks/results/omni.md]
    python benchmarks/omni.py --render benchmarks/results/omni.md   # the same data rendered again
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from provenance import source, stamped  # noqa: E402

from entrain.cli.main import build_parser  # noqa: E402
from entrain.cli.simulate import SimulateRequest, best_fitting_baseline, not_built, simulate  # noqa: E402
from entrain.core.model.omni import QWEN25_OMNI_7B  # noqa: E402

SYSTEMS = ["entrain", "entrain-1f1b", "1f1b", "disttrain", "dip", "dip-greedy"]
SETUP = ["--gpus", "64", "--dp", "4", "--tp", "2", "--global-batch", "512", "--microbatch-size", "4"]


def _request(hardware: str, iterations: int, seed: int) -> SimulateRequest:
    argv = ["simulate", "--model", QWEN25_OMNI_7B, "--dataset", "omni", "--hardware", hardware, *SETUP,
            "--iterations", str(iterations), "--seed", str(seed)]  # fmt: skip
    return SimulateRequest.from_args(build_parser().parse_args(argv))


def _rows(runs: dict, configs: dict) -> list[dict]:
    rows = []
    for name, r in runs.items():
        m, c = r.metrics, configs[name]
        degrees = " / ".join(f"{k} PP {v['pp']} TP {v['tp']}" for k, v in c["components"].items())
        rows.append({
            "system": name, "ms": m.iteration_time_ms, "per_iter": m.iteration_time_ms_per_iter,
            "fits": m.fits_memory, "bubble": m.bubble_ratio, "config": f"DP {c['dp']}, K {c['num_microbatches']}, {degrees}",
            "recompute": c["recompute"],
            "peak_gb": max(m.peak_memory_bytes_per_rank or [0.0]) / 1e9,
        })  # fmt: skip
    return rows


def run_case(hardware: str, iterations: int, seed: int) -> dict:
    req = _request(hardware, iterations, seed)
    out = {"hardware": hardware}
    for path, one in (("n_encoder", False), ("one_encoder", True)):
        t = time.time()
        runs, configs = simulate(req, SYSTEMS, one_encoder=one)
        best, ratio = best_fitting_baseline(runs)
        out[path] = {"rows": _rows(runs, configs), "not_built": not_built(configs), "best_fitting_baseline": best,
                     "best_ratio": ratio, "wall_s": time.time() - t}  # fmt: skip
        print(f"omni: {hardware} {path} done in {time.time() - t:.0f} s", file=sys.stderr, flush=True)
    return out


def fitting_ms(case: dict, path: str, system: str) -> float | None:
    row = next((r for r in case[path]["rows"] if r["system"] == system), None)
    return None if row is None or row["fits"] is False else row["ms"]


def render(res: dict) -> str:
    lines = ["# qwen25-omni-7b on omni: N-encoder plans against today's one-encoder path", ""]
    lines += [f"64 GPUs (DP 4, TP 2), global batch 512, microbatch size 4, seed {res['seed']}, "
              f"{res['iterations']} iterations; wall time {res['wall_s']:.0f} s on a shared 2-core machine. "
              "Times in ms per iteration (mean); ratio = the system's time / Entrain's on the N-encoder path "
              "(> 1: Entrain faster); a plan over device memory (OOM) is no baseline.", ""]  # fmt: skip
    for case in res["cases"]:
        mine = fitting_ms(case, "n_encoder", "entrain")
        one = fitting_ms(case, "one_encoder", "entrain")
        lines += [f"## {case['hardware']}", "",
                  "| path | system | iter ms | / Entrain (N-enc) | / Entrain (1-enc) | fits | bubble | peak GB | configuration |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for path in ("n_encoder", "one_encoder"):
            for r in case[path]["rows"]:
                vs = f"{r['ms'] / mine:.2f}x" if mine else "-"
                vs1 = f"{r['ms'] / one:.2f}x" if one else "-"
                lines.append(f"| {path.replace('_', '-')} | {r['system']} | {r['ms']:.0f} | {vs} | {vs1} | "
                             f"{'yes' if r['fits'] else 'OOM'} | {r['bubble']:.3f} | {r['peak_gb']:.1f} | {r['config']} |")  # fmt: skip
            for name, why in case[path]["not_built"].items():
                lines.append(f"| {path.replace('_', '-')} | {name} | - | - | - | not built | - | - | {why} |")
        fitting = [(p, r["system"], r["ms"]) for p in ("n_encoder", "one_encoder") for r in case[p]["rows"]
                   if r["fits"] is not False and r["system"] not in ("entrain", "entrain-1f1b")]  # fmt: skip
        lines.append("")
        if mine and fitting:
            p, name, ms = min(fitting, key=lambda x: x[2])
            lines.append(f"Entrain (N-encoder) {mine:.0f} ms; the fastest fitting baseline on either path: {name} "
                         f"({p.replace('_', '-')}) at {ms:.0f} ms, {ms / mine:.2f}x (target >= 1.15x).")  # fmt: skip
        if mine and one:
            lines.append(
                f"Entrain on the one-encoder path: {one:.0f} ms ({one / mine:.2f}x the N-encoder Entrain's)."
            )
        lines.append("")
    if res.get("notes"):
        lines += ["## Notes", "", *[f"- {n}" for n in res["notes"]], ""]
    lines += ["Data:", "", "```json", json.dumps(res, indent=1, default=float), "```", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hardware", default="a40-flops,a40-paper")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "omni.md"))
    ap.add_argument(
        "--render", default="", help="a report of this script: render its data again (runs nothing)"
    )
    ap.add_argument(
        "--notes", default="", help="with --render: a text file of notes, one a line, the report keeps"
    )
    args = ap.parse_args()
    if args.render:
        text = Path(args.render).read_text(encoding="utf-8")
        res = json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0])
        if args.notes:
            res["notes"] = [
                x.strip() for x in Path(args.notes).read_text(encoding="utf-8").splitlines() if x.strip()
            ]
        report = stamped(render(res), res["source"])
        Path(args.out).write_text(report, encoding="utf-8")
        print(report)
        return 0
    t = time.time()
    cases = [run_case(h, args.iterations, args.seed) for h in args.hardware.split(",")]
    res = {"source": source(), "iterations": args.iterations, "seed": args.seed, "cases": cases,
           "wall_s": time.time() - t}  # fmt: skip
    report = stamped(render(res), res["source"])
    Path(args.out).write_text(report, encoding="utf-8")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
