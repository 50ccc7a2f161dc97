"""Every system on every workload of the zoo and the paper's four, in simulation, fitting plans only.

    python benchmarks/workload_zoo.py                 # writes benchmarks/results/workload_zoo.{md,json}
    python benchmarks/workload_zoo.py --quick         # two workloads, 1B, one iteration (a smoke run)
    python benchmarks/workload_zoo.py --models 1B --out /tmp/zoo1 &   # the models in parallel, then
    python benchmarks/workload_zoo.py --models 3B --out /tmp/zoo3; wait
    python benchmarks/workload_zoo.py --merge /tmp/zoo1.json /tmp/zoo3.json
    python benchmarks/workload_zoo.py --models QwenVL-7B --datasets text-heavy --out /tmp/th  # one case, then
    python benchmarks/workload_zoo.py --merge benchmarks/results/workload_zoo.json /tmp/th.json  # replace its row

Setup: the paper's (64 GPUs, DP 4, TP 2, global batch 512, microbatch size 4, a40-paper), every model. The
whole-model family presets (``qwen25vl-7b``: Qwen2.5-VL-7B-Instruct's shape; ``llava-ov-7b``:
LLaVA-OneVision-7B's; ``qwen3vl-8b``: Qwen3-VL-8B-Instruct's, DeepStack's extra message bytes priced;
``internvl35-8b``: InternVL3.5-8B's) run the workloads of ``FAMILY_DATASETS``; a40-paper has no fitted
LLM factor for their 7-8B LLMs, so they price it at a40-flops' efficiency (``entrain.core.costs.presets``).
Each case runs ``entrain simulate``'s path (``cli.simulate.simulate_systems``): every system with the
configuration its own method picks; the Algorithm 2 systems get recomputation where a rank overflows
(``sim.memory_fit.fit_memory``); ``dip-greedy-mem`` is DIP's greedy interleaver under an in-flight window
that fits. A schedule that does not fit device memory is marked and never counts as a baseline.

Per case: Entrain against the best fitting baseline and against its ``partition_ideal_ms``, and the
DIP-greedy ablation rows (unbounded memory -> equal memory -> no sub-microbatches -> one chunk per
rank), Entrain with the paper's assignment (``entrain.sim.ablation``) and, where Entrain's plan recomputes,
the same plan without recomputation (memory unchecked: what recomputation costs it). Every miss of the targets (Entrain at least as fast as every fitting baseline; within 1.10x of
``partition_ideal_ms``; a fitting plan at microbatch size 4) is listed with the measured cause.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from entrain.cli.common import resolve_cost_model, workload_source
from entrain.cli.main import build_parser
from entrain.cli.simulate import best_fitting_baseline, simulate_systems
from entrain.core.errors import ConfigError
from entrain.sim.ablation import dip_greedy_ablation, paper_assignment_run, schedule_options
from entrain.sim.run import run_system

ZOO = ("docvqa", "multi-image", "video", "text-heavy", "long-context", "mixture")
PAPER = ("synthchartnet", "chartqa", "cocoqa", "llava150k")
MODELS = {
    "qwen25vl-llama3-1b": "1B",
    "qwen25vl-llama3-3b": "3B",
    "qwen25vl-7b": "QwenVL-7B",
    "llava-ov-7b": "OV-7B",
    "qwen3vl-8b": "Qwen3VL-8B",
    "internvl35-8b": "InternVL3.5-8B",
    "qwen3vl-30b-a3b": "Qwen3VL-30B-A3B",
}
PAPER_MODELS = ("qwen25vl-llama3-1b", "qwen25vl-llama3-3b")
"""The paper's two compositions: the zoo's 20 cases of the regression guard (benchmarks/regression.py)."""
FAMILY_DATASETS = {
    "qwen25vl-7b": ("docvqa", "mixture", "multi-image"),
    "llava-ov-7b": ("anyres", "docvqa", "mixture"),
    "qwen3vl-8b": ("docvqa", "mixture", "video"),
    "internvl35-8b": ("docvqa", "mixture", "multi-image"),
    "qwen3vl-30b-a3b": ("chartqa", "docvqa", "mixture", "text-heavy"),
}
"""The whole-model family presets run fewer workloads (each case is minutes on the shared machine): the
zoo's document, multi-image and mixed ones (for LLaVA-OneVision its own AnyRes workload, for Qwen3-VL
the video one)."""
SEARCHED_DEGREES = {"qwen3vl-30b-a3b"}
"""Models planned at 64 GPUs with DP, TP and ``ep`` left to each system's search instead of the zoo's
fixed DP 4, TP 2: a mixture-of-experts LLM never runs TP with expert parallelism (the runtime refuses
it) and Qwen3-VL-30B-A3B's experts do not fit 48 GB at TP 2 without ``ep`` (143.5 GB on chartqa's first
LLM stage at full recomputation), so ``ep`` is searched with the other degrees (Algorithm 2)."""
SYSTEMS = (
    "entrain", "entrain-1f1b", "1f1b", "disttrain", "dip", "dip-greedy", "dip-greedy-mem", "encoder-rebalance", "dflop",
)  # fmt: skip
IDEAL_TARGET = 1.10
OUT = Path(__file__).parent / "results" / "workload_zoo"
PAPER_ASSIGNMENT = "entrain, paper's assignment"


def _row(run) -> dict:
    m = run.metrics
    return {
        "iteration_time_ms": m.iteration_time_ms,
        "degrees": _degrees(run.layout),
        "fits_memory": m.fits_memory,
        "peak_memory_gb": max(m.peak_memory_bytes_per_rank or [0.0]) / 1e9,
        "partition_ideal_ms": m.partition_ideal_ms,
        "lower_bound_ms": m.lower_bound_ms,
        "bubble_ratio": m.bubble_ratio,
        "encoder_fwd_std_ms": m.encoder_fwd_std_ms,
        "llm_fwd_std_ms": m.llm_fwd_std_ms,
        "recompute": [st.recompute for st in run.layout.stages],
    }


def _degrees(layout) -> str:
    """``DP d, LLM TP t PP p EP e``: the degrees the system's own search chose."""
    llm = layout.components["llm"]
    return f"DP {layout.dp}, LLM TP {llm.tp} PP {llm.pp} EP {llm.ep}"


def _ablations(runs: dict, batches, cost) -> dict:
    """DIP-greedy's edge, one step at a time, and Entrain's assignment, on the same batches."""
    out = {}
    if all(n in runs for n in ("dip-greedy", "dip-greedy-mem", "1f1b")):  # DIP's setup can fail to build
        out = {k: _row(r) for k, r in dip_greedy_ablation(runs, batches, cost).items()}
    out[PAPER_ASSIGNMENT] = _row(paper_assignment_run(runs["entrain"], batches, cost))
    return out


def _without_recompute(run, batches, cost) -> dict | None:
    """Entrain's plan with its recomputation removed (memory unchecked): what recomputation costs it."""
    if all(st.recompute == "none" for st in run.layout.stages):
        return None
    bare = replace(run.layout, stages=tuple(replace(st, recompute="none") for st in run.layout.stages))
    return _row(run_system(run.system, bare, batches, cost, schedule_options(run), trace_iterations=0))


def case_argv(dataset: str, model: str, iterations: int) -> list[str]:
    """The case's ``entrain simulate`` command line: the zoo's DP 4, TP 2 unless ``SEARCHED_DEGREES``."""
    degrees = [] if model in SEARCHED_DEGREES else ["--dp", "4", "--tp", "2"]
    return ["simulate", "--dataset", dataset, "--model", model, "--gpus", "64", *degrees,
            "--global-batch", "512", "--microbatch-size", "4", "--iterations", str(iterations)]  # fmt: skip


def run_case(dataset: str, model: str, iterations: int) -> dict:
    args = build_parser().parse_args(case_argv(dataset, model, iterations))
    case = {"dataset": dataset, "model": MODELS[model], "iterations": iterations}
    try:
        runs, configs = simulate_systems(args, list(SYSTEMS))
    except ConfigError as err:
        return {**case, "error": str(err)}
    cost = resolve_cost_model(args)
    batches = list(workload_source(args, cost).batches(args.global_batch, args.iterations))
    best, ratio = best_fitting_baseline(runs)
    mine = runs["entrain"].metrics
    unbuilt = {n: c["not_built"] for n, c in configs.items() if "not_built" in c}
    return {
        **case,
        "systems": {
            n: {**_row(runs[n]), "source": configs[n]["source"]}
            if n in runs
            else {"fits_memory": False, "not_built": unbuilt[n], "source": configs[n]["source"]}
            for n in SYSTEMS
        },
        "best_fitting_baseline": best,
        "entrain_vs_best_fitting_baseline": ratio,
        "entrain_vs_partition_ideal": mine.iteration_time_ms / mine.partition_ideal_ms,
        "entrain_without_recompute": _without_recompute(runs["entrain"], batches, cost),
        "ablations": _ablations(runs, batches, cost),
    }


def misses(case: dict) -> list[str]:
    """Every target this case misses, with the measured cause."""
    name = f"{case['dataset']} {case['model']}"
    if "error" in case:
        return [f"{name}: no fitting plan at microbatch size 4: {case['error']}"]
    s, out = case["systems"], []
    me = s["entrain"]
    for n, v in s.items():
        if (
            n.startswith("entrain")
            or not v["fits_memory"]
            or v["iteration_time_ms"] >= me["iteration_time_ms"]
        ):
            continue
        out.append(
            f"{name}: {n} is faster ({v['iteration_time_ms'] / me['iteration_time_ms']:.2f}x Entrain's time); "
            f"LLM forward std {me['llm_fwd_std_ms']:.0f} vs {v['llm_fwd_std_ms']:.0f} ms, encoder forward std "
            f"{me['encoder_fwd_std_ms']:.0f} vs {v['encoder_fwd_std_ms']:.0f} ms, bubble {me['bubble_ratio']:.2f} vs "
            f"{v['bubble_ratio']:.2f}, busiest rank's compute {me['lower_bound_ms'] / 1e3:.2f} vs "
            f"{v['lower_bound_ms'] / 1e3:.2f} s, recompute {'/'.join(sorted(set(me['recompute'])))} vs "
            f"{'/'.join(sorted(set(v['recompute'])))}{_recompute_cost(case)}"
        )
    r = case["entrain_vs_partition_ideal"]
    if r > IDEAL_TARGET:
        out.append(
            f"{name}: Entrain is {r:.2f}x its partition_ideal_ms (bubble {me['bubble_ratio']:.2f}, LLM forward std "
            f"{me['llm_fwd_std_ms']:.0f} ms, encoder forward std {me['encoder_fwd_std_ms']:.0f} ms)"
        )
    return out


def _recompute_cost(case: dict) -> str:
    bare = case.get("entrain_without_recompute")
    if bare is None:
        return ""
    fits = "fits" if bare["fits_memory"] else f"does not fit: peak {bare['peak_memory_gb']:.1f} GB"
    return (
        f"; Entrain's recomputation ({'/'.join(case['systems']['entrain']['recompute'])}) costs it "
        f"{case['systems']['entrain']['iteration_time_ms'] / bare['iteration_time_ms']:.2f}x: without it "
        f"{bare['iteration_time_ms'] / 1e3:.1f} s ({fits})"
    )


def _iterations_note(res: dict) -> str:
    """``N iteration(s)``, and the rows run with another count (merged partial runs)."""
    base = res["iterations"]
    other, models = {}, {}
    for c in res["cases"]:
        models.setdefault(c["model"], set()).add(c.get("iterations", base))
    for c in res["cases"]:
        n = c.get("iterations", base)
        if n != base:  # a model's rows all at n: the model; else the row
            other.setdefault(n, set()).add(
                c["model"] if models[c["model"]] == {n} else f"{c['dataset']} {c['model']}"
            )
    notes = [f"{n} for the {'/'.join(sorted(m))} rows" for n, m in sorted(other.items())]
    return f"{base} iteration(s)" + (f" ({'; '.join(notes)})" if notes else "")


def _degrees_note(cases: list[dict]) -> str:
    """The header's degrees: the zoo's DP 4, TP 2, and the rows whose degrees each system searched
    (``SEARCHED_DEGREES``), which do not use them."""
    searched = {MODELS[m] for m in SEARCHED_DEGREES}
    mine = sorted({c["model"] for c in cases if c["model"] in searched})
    if not mine:
        return "DP 4, TP 2"
    note = (
        f"DP, TP and `ep` searched by each system's own method for the {'/'.join(mine)} rows "
        "(`SEARCHED_DEGREES`; each system's `degrees` in the JSON)"
    )
    return note if all(c["model"] in searched for c in cases) else f"DP 4, TP 2; {note}"


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def render(res: dict) -> str:
    cases = res["cases"]
    lines = [
        "# Workload zoo: every system on every workload (simulation)", "",
        f"Generated by `python benchmarks/workload_zoo.py` (wall time {res['elapsed_s']:.0f} s on a shared 2-core machine): 64 GPUs ({_degrees_note(cases)}), global "
        f"batch 512, microbatch size 4, a40-paper, {_iterations_note(res)} per case. Times are simulated "
        "iteration times (s). **OOM** = the schedule does not fit 48 GB on some rank; **no plan** = the system's "
        "configuration cannot be built (its `not_built` in the JSON says why); neither counts as a baseline. Entrain vs best = the fastest fitting baseline's time / Entrain's (> 1: Entrain faster); "
        "vs ideal = Entrain's time / its `partition_ideal_ms`. Recomputation is chosen per stage where a rank "
        "overflows, escalated from the planner's choice and from none (docs/cost_model.md, the simulated check).", "",
    ]  # fmt: skip
    head = (
        "| workload | model | "
        + " | ".join(SYSTEMS)
        + " | best fitting baseline | Entrain vs best | vs ideal |"
    )
    lines += [head, "|" + "---|" * (len(SYSTEMS) + 5)]
    for c in cases:
        if "error" in c:
            lines.append(
                f"| {c['dataset']} | {c['model']} | "
                + " | ".join("-" for _ in SYSTEMS)
                + " | no fit | - | - |"
            )
            continue
        cells = []
        for n in SYSTEMS:
            v = c["systems"].get(n)
            if v is None:  # a row recorded before the system existed
                cells.append("-")
                continue
            if "not_built" in v:  # its configuration cannot be built: it does not fit either
                cells.append("**no plan**")
                continue
            cells.append(f"{v['iteration_time_ms'] / 1e3:.1f}" + ("" if v["fits_memory"] else " **OOM**"))
        lines.append(
            f"| {c['dataset']} | {c['model']} | "
            + " | ".join(cells)
            + f" | {c['best_fitting_baseline']} | {_ratio(c['entrain_vs_best_fitting_baseline'])} | "
            f"{_ratio(c['entrain_vs_partition_ideal'])} |"
        )
    ok = [c for c in cases if "error" not in c]
    wins = sum(1 for c in ok if (c["entrain_vs_best_fitting_baseline"] or 0) >= 1.0)
    ideal = sum(1 for c in ok if c["entrain_vs_partition_ideal"] <= IDEAL_TARGET)
    lines += [
        "", "## Targets", "",
        f"- a fitting Entrain plan at microbatch size 4: {len(ok)}/{len(cases)} cases",
        f"- Entrain at least as fast as every fitting baseline: {wins}/{len(ok)} cases",
        f"- Entrain within {IDEAL_TARGET:.2f}x of `partition_ideal_ms`: {ideal}/{len(ok)} cases",
        "", "## Misses and their causes", "",
    ]  # fmt: skip
    all_misses = [m for c in cases for m in misses(c)]
    lines += [f"- {m}" for m in all_misses] or ["- none"]
    lines += ["", "## Ablations: DIP-greedy step by step; Entrain with the paper's assignment (iteration time s; peak GB)", "",
              "Where DIP-greedy's time comes from, on the same batches: unbounded memory (its own schedule, "
              "OOM where marked) -> an in-flight window that fits (equal memory) -> the same without "
              "sub-microbatches -> one model chunk per rank (Algorithm 2's stages instead of two colocated "
              "chunks per rank); and Entrain re-generated with the paper's assignment (Algorithm 3) in "
              "place of its per-replica choice between it and the two-resource assignment "
              "(`entrain.sim.ablation`).", ""]  # fmt: skip
    names = list(dict.fromkeys(k for c in ok for k in c["ablations"]))
    lines += ["| workload | model | " + " | ".join(names) + " | Entrain |", "|" + "---|" * (len(names) + 3)]
    for c in ok:
        cells = [
            "-"
            if (v := c["ablations"].get(k)) is None
            else f"{v['iteration_time_ms'] / 1e3:.1f} ({v['peak_memory_gb']:.0f} GB)"
            + ("" if v["fits_memory"] else " **OOM**")
            for k in names
        ]
        lines.append(f"| {c['dataset']} | {c['model']} | " + " | ".join(cells)
                     + f" | {c['systems']['entrain']['iteration_time_ms'] / 1e3:.1f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _datasets(args, model: str) -> tuple[str, ...]:
    if args.quick:
        return ("docvqa", "text-heavy")
    if args.datasets:
        return tuple(args.datasets.split(","))
    return FAMILY_DATASETS.get(model, ZOO + PAPER)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--out", default=str(OUT))
    p.add_argument(
        "--models",
        default="1B,3B",
        help="comma list of 1B, 3B, QwenVL-7B, OV-7B, Qwen3VL-8B, InternVL3.5-8B, Qwen3VL-30B-A3B (run them in "
        "parallel processes)",
    )
    p.add_argument("--datasets", default=None, help="comma list of workloads (default: the model's own set)")
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="render these partial runs together (a later file's row replaces an earlier one's)",
    )
    args = p.parse_args(argv)
    if args.merge:
        parts = [json.loads(Path(f).read_text()) for f in args.merge]
        latest = {(c["dataset"], c["model"]): c for part in parts for c in part["cases"]}
        cases = list(latest.values())  # a later part's row replaces an earlier one, in its place
        res = {
            "iterations": parts[0]["iterations"],
            "elapsed_s": max(x["elapsed_s"] for x in parts),
            "cases": cases,
        }
    else:
        wanted = args.models.split(",")
        models = (
            ("qwen25vl-llama3-1b",)
            if args.quick
            else tuple(m for m, short in MODELS.items() if short in wanted)
        )
        iterations = 1 if args.quick else args.iterations
        t0 = time.perf_counter()
        cases = []
        for model in models:
            for d in _datasets(args, model):
                print(f"workload_zoo: {d} {MODELS[model]} ...", file=sys.stderr, flush=True)
                cases.append(run_case(d, model, iterations))
                res = {"iterations": iterations, "elapsed_s": time.perf_counter() - t0, "cases": cases}
                _write(res, Path(args.out))  # after every case: a long run keeps what it finished
        return 0
    _write(res, Path(args.out))
    return 0


def _write(res: dict, out: Path) -> None:
    res["systems"] = list(SYSTEMS)
    res["misses"] = [m for c in res["cases"] for m in misses(c)]
    md = render(res)  # before writing anything: a row it cannot render leaves both files as they were
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    out.with_suffix(".md").write_text(md)
    print(f"workload_zoo: wrote {out.with_suffix('.md')} and .json", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
