"""Entrain / 1F1B really trained on a tiny Qwen3-VL-MoE checkpoint at ``--ep 1`` and ``--ep 2``, beside the
simulator's ratio for the same Plans.

    python -m tests.models.qwen3_vl_moe_tiny DIR
    python benchmarks/cpu_pipeline.py --moe-ep --model-path DIR [--launches 3] [--steps 5] [--order-seed 0]

The checkpoint is ``tests/models/qwen3_vl_moe_tiny.py``'s, written by its ``__main__`` (random weights, ``save_pretrained``: Qwen3-VL's
2-block tower, a 4-layer decoder of 4 experts, top 2, layer 0 dense). Per round, one ``torchrun`` launch
per ``ep`` (order drawn per round from ``--order-seed``) trains ``entrain`` and ``1f1b`` in turn (order
drawn too) on 4 gloo processes, ``--dp 2`` (two replicas of each system's own 2-process layout), the
built-in ``skewed`` set, global batch 8, microbatch size 1, planned with the ``cpu-tiny`` preset; the
first step of each run is dropped. Recorded per ``ep``: the per-round ratio Entrain / 1F1B of median
iteration times (same launch), its median, min and max over rounds; and the simulated ratio of round
0's two ``plan.json`` under the cost model they were planned with (``cpu-tiny``: its MoE layers priced
by the design's expert model, ``docs/design.md`` "Mixture-of-experts costs", on a fit made on a dense
model), and under the profile refitted from round 0's 1F1B trace at that ``ep`` (``entrain profile
--from-trace``, as the paired passes do). Error = simulated / real - 1, target within 5 %. A recorded pass
and its earlier passes are kept as earlier passes. Results: ``benchmarks/results/cpu_moe_ep.{md,json}``.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from cpu_paired import (  # benchmarks/cpu_paired.py
    cpu_over_wall,
    iter_ms,
    load_cost,
    refit_profile,
    simulated_ms,
)
from provenance import source  # benchmarks/provenance.py

SYSTEMS = ("entrain", "1f1b")
EPS = (1, 2)
CONFIG = {
    "dataset": "skewed",
    "hardware": "cpu-tiny",
    "seed": 0,
    "global_batch": 8,
    "microbatch_size": 1,
    "dp": 2,
}
NPROC = 4
SIM_TOLERANCE = 0.05
RESULTS = Path(__file__).parent / "results"
STEM = "cpu_moe_ep"


def checkpoint_folder(path: str | None) -> Path:
    """The tiny Qwen3-VL-MoE checkpoint the passes train (``--model-path``): any whole
    ``Qwen3VLMoeForConditionalGeneration`` folder; the runtime tests' one is written by
    ``python -m tests.models.qwen3_vl_moe_tiny DIR`` (the benchmark never imports the tests)."""
    if not path or not (Path(path) / "config.json").is_file():
        raise SystemExit(
            "cpu_pipeline.py --moe-ep needs --model-path DIR of a tiny Qwen3-VL-MoE checkpoint "
            "(write the tests' one with: python -m tests.models.qwen3_vl_moe_tiny DIR)"
        )
    return Path(path)


def _launch(ckpt: Path, out: str, ep: int, order: list[str], steps: int) -> None:
    cmd = [sys.executable, "-m", "entrain", "train", "--model-path", str(ckpt), "--system", ",".join(order),
           "--ep", str(ep), "--steps", str(steps), "--out", out, "--no-progress", "--nproc", str(NPROC), "--trace"]  # fmt: skip
    for key, value in CONFIG.items():
        cmd += ["--" + key.replace("_", "-"), str(value)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def summarize(per_round: list[dict], sim_ms: dict, refit_ms: dict | None = None) -> dict:
    """Per ``ep``: the rounds' paired ratios Entrain / 1F1B, their median, min and max, the simulated
    ratio and its error against the real median, and the same under the refit (``refit_ms``, like
    ``sim_ms``). ``per_round``: round -> ep (str) -> system -> ms; ``sim_ms``: ep (str) -> system ->
    simulated ms."""
    out = {}
    for ep in sim_ms:
        ratios = [r[ep]["entrain"] / r[ep]["1f1b"] for r in per_round]
        real = statistics.median(ratios)
        sim = sim_ms[ep]["entrain"] / sim_ms[ep]["1f1b"]
        out[ep] = {
            "ratios": ratios,
            "real_ratio": real,
            "spread": [min(ratios), max(ratios)],
            "median_ms": {s: statistics.median(r[ep][s] for r in per_round) for s in SYSTEMS},
            "sim_ms": sim_ms[ep],
            "sim_ratio": sim,
            "sim_rel_error": sim / real - 1,
            "within_tolerance": abs(sim / real - 1) <= SIM_TOLERANCE,
        }
        if refit_ms:
            refit = refit_ms[ep]["entrain"] / refit_ms[ep]["1f1b"]
            out[ep].update(
                refit_sim_ms=refit_ms[ep], refit_sim_ratio=refit, refit_sim_rel_error=refit / real - 1
            )
    return out


def _plan_summary(run: str) -> str:
    with open(os.path.join(run, "plan.json")) as f:
        layout = json.load(f)["layout"]
    stages = " ".join(
        f"{s['component']}[{s['layers'][0]},{s['layers'][1]})@{s['pp_rank']}" for s in layout["stages"]
    )
    return f"DP {layout['dp']}, ep {layout['components']['llm'].get('ep', 1)}: {stages}"


def run(ckpt: Path, rounds: int, steps: int, seed: int) -> dict:
    rng = random.Random(seed)
    per_round, orders, cpu_wall = [], [], []
    with tempfile.TemporaryDirectory(prefix="entrain-moe-ep-") as tmp:
        for i in range(rounds):
            eps = rng.sample(EPS, len(EPS))
            got, walls, order_i = {}, {}, []
            for ep in eps:
                order = rng.sample(SYSTEMS, len(SYSTEMS))
                order_i.append([ep, order])
                out = os.path.join(tmp, f"round{i}", f"ep{ep}")
                _launch(ckpt, out, ep, order, steps)
                got[str(ep)] = {s: iter_ms(os.path.join(out, s)) for s in SYSTEMS}
                walls[str(ep)] = {s: cpu_over_wall(os.path.join(out, s)) for s in SYSTEMS}
                print(f"cpu_moe_ep: round {i} ep {ep}: {got[str(ep)]}", file=sys.stderr, flush=True)
            per_round.append(got)
            cpu_wall.append(walls)
            orders.append(order_i)
        first = os.path.join(tmp, "round0")
        sim, refit, plans, fits = {}, {}, {}, {}
        for ep in EPS:
            runs = {s: os.path.join(first, f"ep{ep}", s) for s in SYSTEMS}
            sim[str(ep)] = {s: simulated_ms(r, load_cost(r)) for s, r in runs.items()}
            plans[str(ep)] = {s: _plan_summary(r) for s, r in runs.items()}
            path = os.path.join(tmp, f"refit_ep{ep}.json")
            got = refit_profile(
                runs["1f1b"], path, f"round 0's 1f1b at ep {ep} of `cpu_pipeline.py --moe-ep`"
            )
            fits[str(ep)] = {"errors": got["from_trace"]["errors"],
                             "expert_imbalance": got["from_trace"].get("expert_imbalance")}  # fmt: skip
            refit[str(ep)] = {s: simulated_ms(r, load_cost("", path)) for s, r in runs.items()}
    return {
        "config": {**CONFIG, "nproc": NPROC, "checkpoint": "tests/models/qwen3_vl_moe_tiny.py save_whole()"},
        "rounds": rounds,
        "steps": steps,
        "orders": orders,
        "iter_ms": per_round,
        "busiestcpu_over_wall": cpu_wall,
        "plans": plans,
        "refit_fit": fits,
        "per_ep": summarize(per_round, sim, refit),
    }


def report(res: dict) -> str:
    src = res["source"]
    lines = [
        "# Tiny Qwen3-VL-MoE on CPU: Entrain / 1F1B at ep 1 and ep 2, real against simulated",
        "",
        f"Source: commit {src['commit']}, `{src['command']}`",
        "",
        f"Generated by `python benchmarks/cpu_pipeline.py --moe-ep` (module `benchmarks/cpu_moe_ep.py`): "
        f"{res['rounds']} rounds x {res['steps']} steps (first dropped), {NPROC} gloo processes, DP 2, "
        "skewed, global batch 8, microbatch size 1, planned with cpu-tiny. Real ratio = median over rounds of "
        "Entrain's median iteration ms / 1F1B's in the same launch (min-max over rounds in brackets). Sim ratio "
        "= round 0's two Plans simulated under cpu-tiny. Error = sim / real - 1 (target |error| <= 5 %).",
        "",
        "| ep | Entrain ms | 1F1B ms | real ratio (min-max) | sim Entrain ms | sim 1F1B ms | sim ratio | error | "
        "busiest rank CPU / wall (E / 1F1B) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for ep, r in res["per_ep"].items():
        cw = " / ".join(
            f"{statistics.median(w[ep][s] for w in res['busiestcpu_over_wall']):.2f}" for s in SYSTEMS
        )
        lines.append(
            f"| {ep} | {r['median_ms']['entrain']:.0f} | {r['median_ms']['1f1b']:.0f} | {r['real_ratio']:.3f} "
            f"({r['spread'][0]:.3f}-{r['spread'][1]:.3f}) | {r['sim_ms']['entrain']:.0f} | {r['sim_ms']['1f1b']:.0f} | "
            f"{r['sim_ratio']:.3f} | {r['sim_rel_error']:+.1%}{'' if r['within_tolerance'] else ' **miss**'} | {cw} |"
        )
    refits = [(ep, r) for ep, r in res["per_ep"].items() if "refit_sim_ratio" in r]
    if refits:
        lines += ["", "Refit (`entrain profile --from-trace` on round 0's 1F1B run at the same ep; in sample for "
                  "1F1B's round 0, out of sample for Entrain's Plan and the other rounds): "
                  + "; ".join(f"ep {ep}: Entrain {r['refit_sim_ms']['entrain']:.0f} ms, 1F1B "
                              f"{r['refit_sim_ms']['1f1b']:.0f} ms, ratio {r['refit_sim_ratio']:.3f}, error "
                              f"{r['refit_sim_rel_error']:+.1%}" for ep, r in refits)]  # fmt: skip
    lines += ["", "Per-round ratios (Entrain / 1F1B): "
              + "; ".join(f"ep {ep}: " + ", ".join(f"{x:.3f}" for x in r["ratios"]) for ep, r in res["per_ep"].items()),
              "", "Plans (round 0): "
              + "; ".join(f"ep {ep} {s}: {p}" for ep, per in res["plans"].items() for s, p in per.items()), ""]  # fmt: skip
    if res.get("note"):
        lines += [f"Note: {res['note']}", ""]
    if res.get("analysis"):
        lines += [f"Reading (added after the run): {res['analysis']}", ""]
    for e in res.get("earlier_passes", []):
        lines += [f"Earlier pass (commit {e['source']['commit']}, `{e['source']['command']}`, {e['rounds']} rounds x "
                  f"{e['steps']} steps): " + "; ".join(
                      f"ep {ep}: real {r['real_ratio']:.3f} ({r['spread'][0]:.3f}-{r['spread'][1]:.3f}), sim "
                      f"{r['sim_ratio']:.3f}, error {r['sim_rel_error']:+.1%}" for ep, r in e["per_ep"].items()), ""]  # fmt: skip
    return "\n".join(lines) + "\n"


def main_moe_ep(args, idle: tuple[bool, float]) -> int:
    res = run(checkpoint_folder(args.model_path), args.launches, args.steps, args.order_seed)
    res["source"] = source()
    res["idle"] = {"passed": idle[0], "idle_fraction": idle[1], "skipped": bool(args.skip_idle_check)}
    res["note"] = args.note
    out = Path(args.out)
    if (out / f"{STEM}.json").exists():  # the recorded pass and its earlier ones become earlier passes
        old = json.loads((out / f"{STEM}.json").read_text())
        keep = ("source", "rounds", "steps", "per_ep", "iter_ms", "orders", "note", "analysis")
        res["earlier_passes"] = [{k: old.get(k) for k in keep}, *old.get("earlier_passes", [])]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{STEM}.json").write_text(json.dumps(res, indent=1) + "\n")
    text = report(res)
    (out / f"{STEM}.md").write_text(text)
    print(text)
    return 0
