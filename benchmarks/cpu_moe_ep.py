"""Entrain / 1F1B really trained on a tiny Qwen3-VL-MoE checkpoint at ``--ep 1`` and ``--ep 2``, beside the
simulator's ratio for the same Plans.

    python -m tests.models.qwen3_vl_moe_tiny DIR
    python benchmarks/cpu_pipeline.py --moe-ep --model-path DIR [--launches 3] [--steps 5] [--order-seed 0]
        [--keep-runs RUNS] [--profile 'RUNS/cpu_moe_ep.ep{ep}.joint.json']

The checkpoint is ``tests/models/qwen3_vl_moe_tiny.py``'s, written by its ``__main__`` (random weights, ``save_pretrained``: Qwen3-VL's
2-block tower, a 4-layer decoder of 4 experts, top 2, layer 0 dense). Per round, one ``torchrun`` launch
per ``ep`` (order drawn per round from ``--order-seed``) trains ``entrain`` and ``1f1b`` in turn (order
drawn too) on 4 gloo processes, ``--dp 2`` (two replicas of each system's own 2-process layout), the
built-in ``skewed`` set, global batch 8, microbatch size 1, planned with the ``cpu-tiny`` preset or, with
``--profile``, with that profile (``{ep}`` in the path: the profile of that ``ep``; the closed loop: an
earlier pass's joint refit); the first step of each run is dropped. Recorded per ``ep``: the per-round
ratio Entrain / 1F1B of median iteration times (same launch), its median, min and max over rounds; the
simulated ratio of round 0's two ``plan.json`` under the cost model they were planned with (``cpu-tiny``:
its MoE layers priced by the design's expert model, ``docs/design.md`` "Mixture-of-experts costs", on a
fit made on a dense model; or the ``--profile``), under the profile refitted from round 0's 1F1B trace at
that ``ep`` (``entrain profile --from-trace``, as the paired passes do), and under the joint refit of
every round's two traces at that ``ep`` (``entrain profile --from-trace 1F1B --also-trace ...
--fit-groups cuts``: a scale per phase for each layer range between the cuts the runs made, so the kinds
inside a range keep the preset's proportions (a ``kinds`` fit cannot tell apart kinds that always share
a stage: on these runs it put a whole LLM stage on the embedding and priced the decoder layers at 0),
the per-action overhead and the measured routing skew; in sample for this pass; written
to ``--keep-runs RUNS`` as ``cpu_moe_ep.ep{ep}.joint.json`` for a closed-loop pass). Error = simulated /
real - 1, target within 5 %. The CPU the runs had is recorded: per system the 4 ranks' process CPU time
over the step's wall time (cores they used of the machine's ``os.cpu_count()``), the busiest rank's, and
per launch the machine's busy cores (``/proc/stat``, startup included). A recorded pass and its earlier
passes are kept as earlier passes. Results: ``benchmarks/results/cpu_moe_ep.{md,json}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cpu_paired import (  # benchmarks/cpu_paired.py
    WARMUP,
    cpu_over_wall,
    iter_ms,
    load_cost,
    profile_labelled,
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
PREDICTIONS = ("refit", "joint")
"""The refitted predictions beside the planning cost model's: ``refit`` (round 0's 1F1B trace),
``joint`` (every round's two traces at the ``ep``)."""
PLACEHOLDERS = {"--model-path": "DIR", "--keep-runs": "RUNS", "--out": "OUT"}


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


def profile_for(profile: str | None, ep: int) -> str | None:
    """The profile ``--profile`` names for ``ep`` (``{ep}`` in the path replaced); None: the preset."""
    return profile.replace("{ep}", str(ep)) if profile else None


def _launch(ckpt: Path, out: str, ep: int, order: list[str], steps: int, profile: str | None) -> None:
    cmd = [sys.executable, "-m", "entrain", "train", "--model-path", str(ckpt), "--system", ",".join(order),
           "--ep", str(ep), "--steps", str(steps), "--out", out, "--no-progress", "--nproc", str(NPROC), "--trace"]  # fmt: skip
    for key, value in CONFIG.items():
        cmd += ["--" + key.replace("_", "-"), str(value)]
    if profile:
        cmd += ["--profile", profile]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def ranks_cores(rows: list[dict]) -> float:
    """The ranks' process CPU time summed over the step's wall time, median over the kept steps of
    ``metrics.jsonl``'s ``rows``: how many cores the run's ranks used (at most the machine's)."""
    return statistics.median(sum(r["cpu_ms"]) / r["iteration_time_ms"] for r in rows[WARMUP:])


def _metrics(run: str) -> list[dict]:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _cpu_jiffies() -> tuple[float, float] | None:
    """(busy, total) jiffies of every core since boot (``/proc/stat``); None where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


@contextlib.contextmanager
def machine_cores(into: dict, key: str):
    """Records under ``into[key]`` the machine's busy cores over the block (``/proc/stat``: busy over
    total jiffies times ``os.cpu_count()``), and its wall seconds; nothing without ``/proc/stat``."""
    t0, before = time.perf_counter(), _cpu_jiffies()
    yield
    after = _cpu_jiffies()
    if before and after and after[1] > before[1]:
        into[key] = {
            "busy_cores": round((after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1), 3),
            "wall_s": round(time.perf_counter() - t0, 1),
        }


def summarize(per_round: list[dict], sim_ms: dict, refit_ms: dict | None = None, **extra: dict) -> dict:
    """Per ``ep``: the rounds' paired ratios Entrain / 1F1B, their median, min and max, the simulated
    ratio and its error against the real median, and the same under the refit (``refit_ms``, like
    ``sim_ms``) and under each of ``extra`` (name -> ms like ``sim_ms``: ``NAME_sim_ms``,
    ``NAME_sim_ratio``, ``NAME_sim_rel_error``). ``per_round``: round -> ep (str) -> system -> ms;
    ``sim_ms``: ep (str) -> system -> simulated ms."""
    out = {}
    others = {"refit": refit_ms, **extra}
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
        for name, ms in others.items():
            if ms and ep in ms:
                ratio = ms[ep]["entrain"] / ms[ep]["1f1b"]
                out[ep].update(
                    {
                        f"{name}_sim_ms": ms[ep],
                        f"{name}_sim_ratio": ratio,
                        f"{name}_sim_rel_error": ratio / real - 1,
                    }
                )
    return out


def _plan_summary(run: str) -> str:
    with open(os.path.join(run, "plan.json")) as f:
        layout = json.load(f)["layout"]
    stages = " ".join(
        f"{s['component']}[{s['layers'][0]},{s['layers'][1]})@{s['pp_rank']}" for s in layout["stages"]
    )
    return f"DP {layout['dp']}, ep {layout['components']['llm'].get('ep', 1)}: {stages}"


def joint_profile(runs: list[str], out: str, label: str) -> dict:
    """``entrain profile --from-trace RUNS[0] --also-trace ... --fit-groups cuts`` (one scale per phase
    for each layer range between the runs' cuts, over every traced compute of ``runs``; the routing skew
    of ``RUNS[0]``'s ``expert_tokens``)
    written to ``out`` (its ``notes.from_trace`` becomes ``label``); what the fit found: the kinds'
    scales, the per-action ms, the skews, and the primary run's simulated stage times' mean error."""
    cmd = [sys.executable, "-m", "entrain", "profile", "--from-trace", runs[0]]
    for run in runs[1:]:
        cmd += ["--also-trace", run]
    cmd += ["--fit-groups", "cuts", "--out", out, "--json"]
    profile, stdout = profile_labelled(cmd, out, label)
    notes, got = profile["notes"], json.loads(stdout)["from_trace"]
    return {
        "runs": len(runs),
        "scales": {
            f"{g['component']} {g['phase']} {g['group']} {g['part']}": round(g["scale"], 4)
            for g in notes.get("group_scales", ())
        },
        "action_overhead_ms": profile["hardware"].get("action_overhead_ms"),
        "expert_skew": notes.get("expert_skew", {}),
        "errors": got["errors"],
    }


def _round(ckpt: Path, root: str, i: int, rng: random.Random, steps: int, profile: str | None) -> dict:
    """One round: a launch per ``ep`` (order drawn), each training both systems (order drawn)."""
    got: dict = {"iter_ms": {}, "busiest": {}, "ranks_cores": {}, "machine": {}, "order": []}
    for ep in rng.sample(EPS, len(EPS)):
        order = rng.sample(SYSTEMS, len(SYSTEMS))
        got["order"].append([ep, order])
        out = os.path.join(root, f"round{i}", f"ep{ep}")
        with machine_cores(got["machine"], str(ep)):
            _launch(ckpt, out, ep, order, steps, profile_for(profile, ep))
        runs = {s: os.path.join(out, s) for s in SYSTEMS}
        got["iter_ms"][str(ep)] = {s: iter_ms(r) for s, r in runs.items()}
        got["busiest"][str(ep)] = {s: cpu_over_wall(r) for s, r in runs.items()}
        got["ranks_cores"][str(ep)] = {s: ranks_cores(_metrics(r)) for s, r in runs.items()}
        print(f"cpu_moe_ep: round {i} ep {ep}: {got['iter_ms'][str(ep)]} machine {got['machine'].get(str(ep))}",
              file=sys.stderr, flush=True)  # fmt: skip
    return got


def _predict(root: str, rounds: int, profile: str | None, profiles: str) -> dict:
    """Round 0's Plans per ``ep`` simulated under the planning cost model, the 1F1B refit and the joint
    refit of every round's traces (written to ``profiles``)."""
    first = os.path.join(root, "round0")
    out: dict = {"sim": {}, "refit": {}, "joint": {}, "plans": {}, "refit_fit": {}, "joint_fit": {}}
    for ep in EPS:
        e = str(ep)
        runs = {s: os.path.join(first, f"ep{ep}", s) for s in SYSTEMS}
        out["sim"][e] = {s: simulated_ms(r, load_cost(r, profile_for(profile, ep))) for s, r in runs.items()}
        out["plans"][e] = {s: _plan_summary(r) for s, r in runs.items()}
        path = os.path.join(profiles, f"{STEM}.ep{ep}.refit.json")
        got = refit_profile(runs["1f1b"], path, f"round 0's 1f1b at ep {ep} of `cpu_pipeline.py --moe-ep`")
        out["refit_fit"][e] = {"errors": got["from_trace"]["errors"],
                               "expert_imbalance": got["from_trace"].get("expert_imbalance")}  # fmt: skip
        out["refit"][e] = {s: simulated_ms(r, load_cost("", path)) for s, r in runs.items()}
        every = [
            os.path.join(root, f"round{i}", f"ep{ep}", s) for s in ("1f1b", "entrain") for i in range(rounds)
        ]
        path = os.path.join(profiles, f"{STEM}.ep{ep}.joint.json")
        label = f"every round's 1f1b and entrain at ep {ep} of `cpu_pipeline.py --moe-ep`"
        out["joint_fit"][e] = joint_profile(every, path, label)
        out["joint"][e] = {s: simulated_ms(r, load_cost("", path)) for s, r in runs.items()}
    return out


def run(
    ckpt: Path, rounds: int, steps: int, seed: int, profile: str | None = None, keep: str | None = None
) -> dict:
    rng = random.Random(seed)
    with contextlib.ExitStack() as stack:
        root = keep or stack.enter_context(tempfile.TemporaryDirectory(prefix="entrain-moe-ep-"))
        os.makedirs(root, exist_ok=True)
        got = [_round(ckpt, root, i, rng, steps, profile) for i in range(rounds)]
        pred = _predict(root, rounds, profile, root)
    return {
        "config": {**CONFIG, "nproc": NPROC, "checkpoint": "tests/models/qwen3_vl_moe_tiny.py save_whole()"},
        "planned_with": os.path.basename(profile) if profile else "cpu-tiny",
        "rounds": rounds,
        "steps": steps,
        "cpu_count": os.cpu_count(),
        "orders": [g["order"] for g in got],
        "iter_ms": [g["iter_ms"] for g in got],
        "busiestcpu_over_wall": [g["busiest"] for g in got],
        "ranks_cores": [g["ranks_cores"] for g in got],
        "machine_cores": [g["machine"] for g in got],
        "plans": pred["plans"],
        "refit_fit": pred["refit_fit"],
        "joint_fit": pred["joint_fit"],
        "per_ep": summarize([g["iter_ms"] for g in got], pred["sim"], pred["refit"], joint=pred["joint"]),
    }


def _median_of(rows: list[dict], ep: str, system: str | None = None) -> float | None:
    vals = [r[ep][system] if system else r[ep]["busy_cores"] for r in rows if ep in r]
    return statistics.median(vals) if vals else None


def _cpu_cells(res: dict, ep: str) -> str:
    """Three table cells: the busiest rank's CPU / wall (E / 1F1B); the ranks' cores (E / 1F1B); the
    machine's busy cores per launch ("-" for a pass that did not record them)."""
    busiest = " / ".join(f"{_median_of(res['busiestcpu_over_wall'], ep, s):.2f}" for s in SYSTEMS)
    if "ranks_cores" not in res:
        return f"{busiest} | - | -"
    ranks = " / ".join(f"{_median_of(res['ranks_cores'], ep, s):.2f}" for s in SYSTEMS)
    machine = _median_of(res.get("machine_cores", []), ep)
    return f"{busiest} | {ranks} | " + (f"{machine:.2f}" if machine is not None else "-")


def _prediction_text(name: str, r: dict) -> str:
    return (f"Entrain {r[f'{name}_sim_ms']['entrain']:.0f} ms, 1F1B {r[f'{name}_sim_ms']['1f1b']:.0f} ms, ratio "
            f"{r[f'{name}_sim_ratio']:.3f}, error {r[f'{name}_sim_rel_error']:+.1%}")  # fmt: skip


def _header(res: dict) -> list[str]:
    planned = res.get("planned_with", "cpu-tiny")
    closed = planned != "cpu-tiny"
    return [
        "# Tiny Qwen3-VL-MoE on CPU: Entrain / 1F1B at ep 1 and ep 2, real against simulated",
        "",
        f"Source: commit {res['source']['commit']}, `{res['source']['command']}`",
        "",
        f"Generated by `python benchmarks/cpu_pipeline.py --moe-ep` (module `benchmarks/cpu_moe_ep.py`): "
        f"{res['rounds']} rounds x {res['steps']} steps (first dropped), {NPROC} gloo processes, DP 2, "
        f"skewed, global batch 8, microbatch size 1, planned with {planned}"
        + (" (the closed loop: an earlier pass's joint refit of its traces at that ep, out of sample here)" if closed else "")
        + ". Real ratio = median over rounds of Entrain's median iteration ms / 1F1B's in the same launch "
        f"(min-max over rounds in brackets). Sim ratio = round 0's two Plans simulated under {planned}. "
        "Error = sim / real - 1 (target |error| <= 5 %). CPU: the busiest rank's process CPU over the step's "
        f"wall; the {NPROC} ranks' CPU over the step's wall (cores used, of the machine's "
        f"{res.get('cpu_count', 2)}); the machine's busy cores over each whole launch (`/proc/stat`: the "
        "ranks' startup and any other work on the machine included). Medians over rounds.",
        "",
        "| ep | Entrain ms | 1F1B ms | real ratio (min-max) | sim Entrain ms | sim 1F1B ms | sim ratio | error | "
        "busiest rank CPU / wall (E / 1F1B) | ranks' cores (E / 1F1B) | machine busy cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip


def report(res: dict) -> str:
    lines = _header(res)
    for ep, r in res["per_ep"].items():
        cpu = _cpu_cells(res, ep)
        lines.append(
            f"| {ep} | {r['median_ms']['entrain']:.0f} | {r['median_ms']['1f1b']:.0f} | {r['real_ratio']:.3f} "
            f"({r['spread'][0]:.3f}-{r['spread'][1]:.3f}) | {r['sim_ms']['entrain']:.0f} | {r['sim_ms']['1f1b']:.0f} | "
            f"{r['sim_ratio']:.3f} | {r['sim_rel_error']:+.1%}{'' if r['within_tolerance'] else ' **miss**'} | {cpu} |"
        )
    per_ep = res["per_ep"].items()
    if any("refit_sim_ratio" in r for _, r in per_ep):
        lines += ["", "Refit (`entrain profile --from-trace` on round 0's 1F1B run at the same ep; in sample for "
                  "1F1B's round 0, out of sample for Entrain's Plan and the other rounds): "
                  + "; ".join(f"ep {ep}: {_prediction_text('refit', r)}" for ep, r in per_ep if "refit_sim_ratio" in r)]  # fmt: skip
    if any("joint_sim_ratio" in r for _, r in per_ep):
        lines += ["", "Joint refit (`entrain profile --from-trace 1F1B --also-trace ... --fit-groups cuts` over every "
                  "round's 1F1B and Entrain traces at the same ep: one scale per phase for each layer range between "
                  "the runs' cuts, the per-action overhead, the "
                  "routing skew of round 0's 1F1B run; in sample for every round): "
                  + "; ".join(f"ep {ep}: {_prediction_text('joint', r)}" for ep, r in per_ep if "joint_sim_ratio" in r)]  # fmt: skip
        skews = "; ".join(f"ep {ep}: " + ", ".join(f"layer {k} {v:.2f}" for k, v in f["expert_skew"].items())
                          for ep, f in res.get("joint_fit", {}).items() if f.get("expert_skew"))  # fmt: skip
        if skews:
            lines += [
                "",
                f"Measured routing skew (busiest expert over a uniform router's, the joint refit's): {skews}",
            ]
    lines += ["", "Per-round ratios (Entrain / 1F1B): "
              + "; ".join(f"ep {ep}: " + ", ".join(f"{x:.3f}" for x in r["ratios"]) for ep, r in per_ep),
              "", "Plans (round 0): "
              + "; ".join(f"ep {ep} {s}: {p}" for ep, per in res["plans"].items() for s, p in per.items()), ""]  # fmt: skip
    if res.get("note"):
        lines += [f"Note: {res['note']}", ""]
    if res.get("analysis"):
        lines += [f"Reading (added after the run): {res['analysis']}", ""]
    for e in res.get("earlier_passes", []):
        lines += [_earlier(e), ""]
    return "\n".join(lines) + "\n"


def _earlier(e: dict) -> str:
    planned = e.get("planned_with") or "cpu-tiny"

    def one(ep: str, r: dict) -> str:
        text = (f"ep {ep}: real {r['real_ratio']:.3f} ({r['spread'][0]:.3f}-{r['spread'][1]:.3f}), sim "
                f"{r['sim_ratio']:.3f}, error {r['sim_rel_error']:+.1%}")  # fmt: skip
        for name in PREDICTIONS:
            if f"{name}_sim_ratio" in r:
                text += f", {name} {r[f'{name}_sim_ratio']:.3f} ({r[f'{name}_sim_rel_error']:+.1%})"
        return text

    return (f"Earlier pass (commit {e['source']['commit']}, `{e['source']['command']}`, {e['rounds']} rounds x "
            f"{e['steps']} steps, planned with {planned}): " + "; ".join(one(ep, r) for ep, r in e["per_ep"].items()))  # fmt: skip


def _command(src: dict) -> dict:
    """``src`` with the command's folder arguments (``PLACEHOLDERS``; ``--profile``'s folder) named, not spelled."""
    words = src["command"].split(" ")
    for i, w in enumerate(words[:-1]):
        if w in PLACEHOLDERS:
            words[i + 1] = PLACEHOLDERS[w]
        elif w == "--profile":
            words[i + 1] = "RUNS/" + os.path.basename(words[i + 1])
    return {**src, "command": " ".join(words)}


def main_moe_ep(args, idle: tuple[bool, float]) -> int:
    profile = getattr(args, "profile", None)
    keep = getattr(args, "keep_runs", None)
    res = run(checkpoint_folder(args.model_path), args.launches, args.steps, args.order_seed, profile, keep)
    res["source"] = _command(source())
    res["idle"] = {"passed": idle[0], "idle_fraction": idle[1], "skipped": bool(args.skip_idle_check)}
    res["note"] = args.note
    out = Path(args.out)
    if (out / f"{STEM}.json").exists():  # the recorded pass and its earlier ones become earlier passes
        old = json.loads((out / f"{STEM}.json").read_text())
        keep_fields = ("source", "rounds", "steps", "per_ep", "iter_ms", "orders", "note", "analysis", "planned_with",
                       "ranks_cores", "machine_cores", "busiestcpu_over_wall", "joint_fit", "plans")  # fmt: skip
        res["earlier_passes"] = [{k: old[k] for k in keep_fields if k in old}, *old.get("earlier_passes", [])]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{STEM}.json").write_text(json.dumps(res, indent=1) + "\n")
    text = report(res)
    (out / f"{STEM}.md").write_text(text)
    print(text)
    return 0
