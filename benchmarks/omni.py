"""The omni preset (``qwen25-omni-7b``: Qwen2.5-Omni-7B's thinker, an audio tower beside the vision
tower) on the ``omni`` workload, side by side in one process on the same batches:

* the **N-encoder path** (``simulate(..., choose_towers=False)``): one pipeline per encoder, each system
  that plans one (``entrain.sim.encoders_run``: Entrain's with its microbatch count chosen by
  simulation, ``fit_entrain``), recomputation fitted to memory; the others not built (their reasons);
* the **one-encoder path** (``simulate(..., one_encoder=True)``): both towers as one encoder component in
  the first stages (1F1B's way), the audio tower priced from its own layer specs on the first encoder
  layer (``LayerCost.audio``), every system with its own search, memory fitting and extensions.

Both paths price a sample's audio with the audio tower's layers (``model.omni.audio_tower_specs``), so
ratios across paths are like for like. Entrain's layout is the faster fitting of its two runs
(``simulate.choose_entrain_towers``, what ``entrain simulate`` reports for this model); ratios are each
fitting baseline's iteration time over that Entrain's. Setup: the workload zoo's (64 GPUs, DP 4, TP 2, global batch
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
from entrain.cli.simulate import (  # noqa: E402
    ENTRAIN,
    SimulateRequest,
    best_fitting_baseline,
    choose_entrain_towers,
    not_built,
    simulate,
)
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
    got = {}
    for path, one in (("n_encoder", False), ("one_encoder", True)):
        t = time.time()
        runs, configs = simulate(req, SYSTEMS, one_encoder=one, choose_towers=False)
        got[path] = (runs, configs)
        best, ratio = best_fitting_baseline(runs)
        out[path] = {"rows": _rows(runs, configs), "not_built": not_built(configs), "best_fitting_baseline": best,
                     "best_ratio": ratio, "wall_s": time.time() - t}  # fmt: skip
        out[path]["decisions"] = configs.get(ENTRAIN, {}).get("decisions", [])
        print(f"omni: {hardware} {path} done in {time.time() - t:.0f} s", file=sys.stderr, flush=True)
    (runs, configs), (one_runs, one_configs) = got["n_encoder"], got["one_encoder"]
    if ENTRAIN in runs and ENTRAIN in one_runs:
        d = choose_entrain_towers(dict(runs), dict(configs), one_runs[ENTRAIN], one_configs[ENTRAIN],
                                  req.config.config_request().margin)  # fmt: skip
        out["towers"] = d.to_json()
    return out


def fitting_ms(case: dict, path: str, system: str) -> float | None:
    row = next((r for r in case[path]["rows"] if r["system"] == system), None)
    return None if row is None or row["fits"] is False else row["ms"]


PATHS = {"n_encoder": "one pipeline per encoder", "one_encoder": "both in the first stages"}
"""Each path's layout, as the ``encoder towers`` decision names it (``simulate.PER_ENCODER`` / ``SHARED``)."""


def chosen_path(case: dict) -> str | None:
    """The path of Entrain's chosen layout (``case["towers"]``, the ``encoder towers`` decision)."""
    d = case.get("towers")
    return None if d is None else next(p for p, name in PATHS.items() if name == d["chosen"])


def baselines(case: dict) -> list[tuple[str, str, float]]:
    """(path, system, ms) of every fitting baseline on both paths, fastest first."""
    rows = [(p, r["system"], r["ms"]) for p in PATHS for r in case[p]["rows"]
            if r["fits"] is not False and r["system"] not in ("entrain", "entrain-1f1b")]  # fmt: skip
    return sorted(rows, key=lambda x: x[2])


def render(res: dict) -> str:
    lines = ["# qwen25-omni-7b on omni: Entrain's layout choice against every baseline on both paths", ""]
    lines += [f"64 GPUs (DP 4, TP 2), global batch 512, microbatch size 4, seed {res['seed']}, "
              f"{res['iterations']} iterations; wall time {res['wall_s']:.0f} s on a shared 2-core machine. "
              "Times in ms per iteration (mean); ratio = the system's time / Entrain's on the layout it chose "
              "(> 1: Entrain faster); a plan over device memory (OOM) is no baseline. Both paths price a "
              "sample's audio with the audio tower's own layers.", ""]  # fmt: skip
    for case in res["cases"]:
        path = chosen_path(case)
        mine = fitting_ms(case, path, "entrain") if path else None
        lines += [f"## {case['hardware']}", "",
                  "| path | system | iter ms | / Entrain (chosen) | fits | bubble | peak GB | configuration |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for p in PATHS:
            for r in case[p]["rows"]:
                vs = f"{r['ms'] / mine:.2f}x" if mine else "-"
                lines.append(f"| {p.replace('_', '-')} | {r['system']} | {r['ms']:.0f} | {vs} | "
                             f"{'yes' if r['fits'] else 'OOM'} | {r['bubble']:.3f} | {r['peak_gb']:.1f} | {r['config']} |")  # fmt: skip
            for name, why in case[p]["not_built"].items():
                lines.append(f"| {p.replace('_', '-')} | {name} | - | - | not built | - | - | {why} |")
        lines.append("")
        for d in case["n_encoder"].get("decisions", []):
            if d["name"] == "microbatch count":
                times = ", ".join(
                    f"{n} {'does not fit' if v is None else f'{v:.0f} ms'}"
                    for n, v in d["candidates"].items()
                )
                lines.append(f"Entrain (n-encoder): {d['name']}: {d['chosen']} ({times}).")  # fmt: skip
        if path:
            d = case["towers"]
            times = ", ".join(
                f"{n} {'does not fit' if v is None else f'{v:.0f} ms'}" for n, v in d["candidates"].items()
            )
            lines.append(f"Entrain's layout (encoder towers): {d['chosen']} ({times}).")
        fitting = baselines(case)
        if mine and fitting:
            each = "; ".join(f"{n} ({p.replace('_', '-')}) {ms / mine:.2f}x" for p, n, ms in fitting)
            p, name, ms = fitting[0]
            met = "met" if ms / mine >= 1.15 else "missed"
            lines.append(f"Entrain ({PATHS[path]}) {mine:.0f} ms against every fitting baseline on both paths: {each}. "
                         f"The fastest, {name} ({p.replace('_', '-')}) at {ms:.0f} ms: {ms / mine:.2f}x "
                         f"(target >= 1.15x: {met}).")  # fmt: skip
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
