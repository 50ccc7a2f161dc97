"""Two-resource assignment vs the paper's, side by side in one run (simulated).

Part ``paper``: every ``bench paper`` case (4 datasets x Llama3-1B/3B x a40-paper/a40-flops, the
paper setup: 64 GPUs, DP 4, TP 2, global batch 512, microbatch size 4), Entrain's default setup
(boundary sharing, ramp and split weight gradients as ``bench paper``'s default Entrain) with the
paper's assignment and with ``assignment="auto"`` on the same batches. Target: auto / paper <= 1.01.

Part ``zoo``: ``entrain simulate`` at the paper setup (qwen25vl-llama3-1b, a40-paper) on the workload
zoo and the paper's four datasets: Entrain (``auto``), Entrain with the paper's assignment, 1F1B,
DistTrain, DIP and DIP-greedy; iteration time, LLM / encoder forward-time std and memory fit.
Target: on LLM-dominant workloads Entrain's LLM forward-time std <= 1F1B's.

    python benchmarks/two_resource.py [--part paper|zoo|all] [--iterations N] [--zoo-iterations N]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from dataclasses import replace
from pathlib import Path

from provenance import source, stamped  # benchmarks/provenance.py (scripts run from this folder)

from entrain.cli.bench import DATASETS, GLOBAL_BATCH, GPUS, HARDWARE, MICROBATCH, MODELS, TP
from entrain.cli.bench import DP as BENCH_DP
from entrain.cli.main import main as cli
from entrain.core.costs.presets import build_cost_model
from entrain.core.errors import ConfigError
from entrain.core.planning.setups import ConfigRequest, entrain_variant, system_setups
from entrain.data.sampling import dataset_sampler
from entrain.data.workload_io import load_workload
from entrain.data.zoo_generators import ZOO
from entrain.sim.choose import candidate_judge
from entrain.sim.run import run_system

RESULTS = Path(__file__).parent / "results"
ZOO_SYSTEMS = ("entrain", "1f1b", "disttrain", "dip", "dip-greedy")
LLM_DOMINANT = ("text-heavy", "long-context")


def paper_case(dataset: str, model: str, hardware: str, iterations: int, seed: int = 0) -> dict:
    """Entrain's bench-paper default with the paper's vs the auto assignment on the same batches."""
    cost = build_cost_model(model, hardware)
    batches = list(
        load_workload(dataset, cost, global_batch=GLOBAL_BATCH, iterations=iterations, seed=seed, tp=TP)
    )
    req = ConfigRequest(dataset, model, GPUS, BENCH_DP, TP, GLOBAL_BATCH, MICROBATCH, seed,
                        entrain_layout="disjoint", entrain_ramp=0, entrain_split=False,
                        entrain_assignment="paper")  # fmt: skip
    sampler = dataset_sampler(dataset, seed)
    judge = candidate_judge(sampler, cost, req)
    base = system_setups(["entrain"], req, cost, sampler)["entrain"]
    out: dict = {"dataset": dataset, "model": model, "hardware": hardware}
    for assignment in ("paper", "auto"):
        variant = replace(req, entrain_layout="auto", entrain_ramp="auto", entrain_split=True,
                          entrain_assignment=assignment)  # fmt: skip
        setup = entrain_variant(base, variant, cost, judge)
        run = run_system("entrain", setup.layout, batches, cost, setup.options, trace_iterations=0)
        out[assignment] = {
            "iteration_time_ms": run.metrics.iteration_time_ms,
            "llm_fwd_std_ms": run.metrics.llm_fwd_std_ms,
            "encoder_fwd_std_ms": run.metrics.encoder_fwd_std_ms,
        }
        chosen = run.plan.options.get("assignment_chosen")
        if chosen:
            flat = [c for it in chosen for c in it]
            out[assignment]["two_resource_share"] = flat.count("two-resource") / len(flat)
    out["auto_over_paper"] = out["auto"]["iteration_time_ms"] / out["paper"]["iteration_time_ms"]
    return out


def zoo_case(dataset: str, iterations: int) -> dict:
    """``entrain simulate --json`` at the paper setup: Entrain auto and paper assignment + baselines."""
    common = ["--dataset", dataset, "--gpus", str(GPUS), "--dp", str(BENCH_DP), "--tp", str(TP),
              "--global-batch", str(GLOBAL_BATCH), "--microbatch-size", str(MICROBATCH),
              "--iterations", str(iterations), "--json"]  # fmt: skip
    out: dict = {"dataset": dataset}
    for label, extra in (("all", ["--systems", ",".join(ZOO_SYSTEMS)]),
                         ("entrain-paper-assignment", ["--systems", "entrain", "--assignment", "paper"])):  # fmt: skip
        buf, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
            try:
                rc = cli(["simulate", *common, *extra])
            except ConfigError as e:
                rc, err = 2, io.StringIO(str(e))
        if rc != 0:
            out["error"] = err.getvalue().strip().splitlines()[-1]
            return out
        systems = json.loads(buf.getvalue())["systems"]
        if label == "all":
            out["systems"] = {n: _row(s) for n, s in systems.items()}
        else:
            out["systems"]["entrain (paper assignment)"] = _row(systems["entrain"])
    return out


def _row(s: dict) -> dict:
    keys = ("iteration_time_ms", "llm_fwd_std_ms", "encoder_fwd_std_ms", "fits_memory", "memory_gb")
    return {k: s[k] for k in keys if k in s}


def _md_paper(cases: list[dict]) -> list[str]:
    lines = ["## Part paper: every `bench paper` case, Entrain default with the paper's vs the auto assignment", "",
             "| dataset | model | hardware | paper assignment ms | auto ms | auto / paper | two-resource chosen | LLM std paper / auto ms |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in cases:
        p, a = c["paper"], c["auto"]
        lines.append(f"| {c['dataset']} | {c['model']} | {c['hardware']} | {p['iteration_time_ms']:.1f} | "
                     f"{a['iteration_time_ms']:.1f} | {c['auto_over_paper']:.4f} | {a.get('two_resource_share', 0):.0%} | "
                     f"{p['llm_fwd_std_ms']:.1f} / {a['llm_fwd_std_ms']:.1f} |")  # fmt: skip
    worst = max(c["auto_over_paper"] for c in cases)
    lines += [
        "",
        f"Worst auto / paper: {worst:.4f} (target <= 1.01): {'met' if worst <= 1.01 else 'NOT met'}.",
        "",
    ]
    return lines


def _md_zoo(cases: list[dict]) -> list[str]:
    lines = ["## Part zoo: `entrain simulate` at the paper setup (qwen25vl-llama3-1b, a40-paper)", "",
             "| workload | system | iteration ms | vs Entrain | LLM fwd std ms | encoder fwd std ms | fits memory |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in cases:
        if "error" in c:
            lines.append(f"| {c['dataset']} | (all) | error: {c['error']} | | | | |")
            continue
        ref = c["systems"]["entrain"]["iteration_time_ms"]
        for name, s in c["systems"].items():
            fits = s.get("fits_memory")
            lines.append(f"| {c['dataset']} | {name} | {s['iteration_time_ms']:.1f} | {s['iteration_time_ms'] / ref:.2f}x | "
                         f"{s['llm_fwd_std_ms']:.1f} | {s['encoder_fwd_std_ms']:.1f} | {'' if fits is None else fits} |")  # fmt: skip
    lines.append("")
    for c in cases:
        if c["dataset"] in LLM_DOMINANT and "systems" in c:
            e, o = c["systems"]["entrain"]["llm_fwd_std_ms"], c["systems"]["1f1b"]["llm_fwd_std_ms"]
            lines.append(f"- {c['dataset']} (LLM-dominant): Entrain LLM fwd std {e:.1f} ms vs 1F1B {o:.1f} ms: "
                         f"{'met' if e <= o else 'NOT met'} (target Entrain <= 1F1B).")  # fmt: skip
    return [*lines, ""]


def _write(res: dict, args, out: Path) -> None:
    """The report so far (rewritten after every case, so a partial run still reports what it measured)."""
    parts = [f"{args.iterations} iterations per bench-paper case" if "paper" in res else "",
             f"{args.zoo_iterations} per zoo workload" if "zoo" in res else ""]  # fmt: skip
    lines = ["# Two-resource assignment vs the paper's (simulated)", "",
             f"Generated by `python benchmarks/two_resource.py --part {args.part} --iterations {args.iterations} "
             f"--zoo-iterations {args.zoo_iterations}` in {res['wall_s']:.0f} s "
             f"({', '.join(p for p in parts if p)}, seed 0). "
             "Both columns of a row come from the same batches and the same simulator run.", ""]  # fmt: skip
    if "paper" in res:
        lines += _md_paper(res["paper"])
    if "zoo" in res:
        lines += _md_zoo(res["zoo"])
    res["source"] = source(res)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(stamped("\n".join(lines), res["source"]))
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("paper", "zoo", "all"), default="all")
    ap.add_argument("--iterations", type=int, default=20, help="iterations per bench-paper case")
    ap.add_argument("--zoo-iterations", type=int, default=10)
    ap.add_argument("--datasets", default=",".join((*LLM_DOMINANT, *ZOO, *DATASETS)),
                    help="zoo part: comma list of workloads, in the order to run them")  # fmt: skip
    ap.add_argument("--out", default=str(RESULTS / "two_resource.md"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    out = Path(args.out)
    res: dict = {"iterations": args.iterations, "zoo_iterations": args.zoo_iterations, "wall_s": 0.0}
    if args.part in ("paper", "all"):
        res["paper"] = []
        for h in HARDWARE:
            for m in MODELS:
                for d in DATASETS:
                    res["paper"].append(paper_case(d, m, h, args.iterations))
                    res["wall_s"] = time.perf_counter() - t0
                    _write(res, args, out)
                    print(f"{d} {m} {h}: auto/paper {res['paper'][-1]['auto_over_paper']:.4f}", flush=True)
    if args.part in ("zoo", "all"):
        res["zoo"] = []
        for d in dict.fromkeys(x.strip() for x in args.datasets.split(",") if x.strip()):
            res["zoo"].append(zoo_case(d, args.zoo_iterations))
            res["wall_s"] = time.perf_counter() - t0
            _write(res, args, out)
            print(f"{d}: {'error' if 'error' in res['zoo'][-1] else 'done'}", flush=True)
    print(f"wrote {out} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
