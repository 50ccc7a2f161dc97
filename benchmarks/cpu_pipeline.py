"""Entrain vs 1F1B vs DistTrain, really trained on this CPU.

The tiny VLM on the built-in ``skewed`` set (fixed before measuring: seed 0, global batch 16,
microbatch size 1, 1 encoder + 1 LLM stage on 2 processes). After an idle check (the CPUs at least
90 % idle, sampled from /proc/stat), ``LAUNCHES`` torchrun launches each train the three systems in
turn on the same batches (fresh model each), plus one launch each of Entrain with one of our
extensions (``EXTENSION_ROWS``: the boundary-sharing layout, split weight gradients); the first
``WARMUP`` steps of each are dropped. The order of the systems within a launch and of the launches
within a round is drawn per round from ``--order-seed``, so no system always runs first. Printed
side by side: median iteration time and its ratio to 1F1B, per-round paired ratios to that round's
1F1B (median, min, max, IQR), median per-microbatch stage-time std and its ratio, per-rank CPU time
next to wall time, and the simulator's prediction for the very Plans that ran (``plan.json`` of each
run, simulated under ``cpu-tiny``). A target is decided on the paired per-round ratios (their
median), never on a ratio of medians. Results go to ``benchmarks/results/cpu_pipeline.{md,json}``.

    python benchmarks/cpu_pipeline.py [--launches 3] [--steps 7] [--order-seed 0] [--skip-idle-check]
        [--dataset skewed|text-heavy] [--in-stage]

``--dataset text-heavy`` runs the same protocol on LLM-dominant data
(``LLM_CONFIG``: the built-in ``text-heavy`` generator, half the samples text-only with long answers,
images capped at 224 x 224 px; global batch 24, microbatch size 4, each system's own 2-process layout).
The shared launch trains Entrain with ``--assignment two-resource`` next to 1F1B and DistTrain; the
extension launches are Entrain with ``--assignment auto`` and with ``--assignment paper``. Targets:
Entrain (two-resource) <= 1F1B and <= DistTrain, each on the median of the paired per-round ratios.
Also printed: the simulator's LLM forward-time std and the assignments each plan recorded. Results go
to ``benchmarks/results/cpu_pipeline_text_heavy.{md,json}``. Full runs, the CPUs otherwise idle (about 7
min each on an idle 2-core machine, estimated from the smoke runs' CPU time: 1 round x 2 steps took
84-131 s wall and 75 s CPU on the shared, loaded machine):

    python benchmarks/cpu_pipeline.py --launches 5 --steps 7
    python benchmarks/cpu_pipeline.py --dataset text-heavy --launches 5 --steps 7

``--paired``: `benchmarks/cpu_paired.py`. ``--moe-ep``: `benchmarks/cpu_moe_ep.py` (a tiny Qwen3-VL-MoE
checkpoint, Entrain / 1F1B at ``--ep 1`` and ``--ep 2`` on 4 processes, against the simulator). ``--omni``:
`benchmarks/cpu_omni.py` (a tiny Qwen2.5-Omni thinker, Entrain with one pipeline per encoder tower / 1F1B
on 3 processes, against the simulator, losses compared).

``--in-stage`` instead measures parallelism inside the stages next to plain 1F1B: 1F1B with
``--dp 2``, with ``--dp 2 --fsdp`` and with ``--tp 2`` (4 processes each), iteration time and model-state
and peak memory per rank, into ``benchmarks/results/cpu_pipeline_in_stage.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from cpu_paired import PAIRED_CONFIGS, main_paired, rescore_joint  # benchmarks/cpu_paired.py
from idle import cpu_idle_fraction  # benchmarks/idle.py (scripts run from this folder)
from provenance import source, stamped  # benchmarks/provenance.py

SYSTEMS = ("entrain", "1f1b", "disttrain")
SHARED = "entrain-shared"
"""Entrain with its boundary-sharing layout (our extension): the same 2 processes, but one min-max
partition of the encoder-then-LLM layers over them instead of 1 encoder + 1 LLM stage."""
SPLIT = "entrain-split"
"""Entrain, paper layout, every backward as input then weight gradients (our extension)."""
EXTENSION_ROWS = {
    SHARED: ("--entrain-layout", "shared", "--split-weight-grads", "off"),
    SPLIT: ("--entrain-layout", "disjoint", "--split-weight-grads", "on"),
}
"""Extra Entrain launches: row -> ``entrain train`` flags (each run in its own subfolder). The layout and
split flags are explicit: ``train``'s defaults (``--entrain-layout auto``, split weight gradients on)
would make all three Entrain rows the same shared-layout, split-gradient plan."""
PAPER_LAYOUT = ("--entrain-layout", "disjoint", "--split-weight-grads", "off")
"""The ``entrain`` row of ``skewed``: 1 encoder + 1 LLM stage, one backward per microbatch."""
IN_STAGE_ROWS = {
    "1f1b-dp2": (("--dp", "2"), 4),
    "1f1b-dp2-fsdp": (("--dp", "2", "--fsdp"), 4),
    "1f1b-tp2": (("--tp", "2"), 4),
}
"""``--in-stage``: parallelism inside the stages, 1F1B on 1 encoder + 1 LLM stage: row -> (flags,
processes), measured side by side with the plain 1F1B row (2 processes) in each launch; written to
``cpu_pipeline_in_stage.{md,json}``."""
ROWS = (*SYSTEMS, *EXTENSION_ROWS)
WARMUP = 1
TARGET_RATIO = 0.9
"""Entrain's iteration time at most this fraction of 1F1B's (paired per round)."""
CONFIG = {
    "model": "tiny",
    "dataset": "skewed",
    "seed": 0,
    "global_batch": 16,
    "microbatch_size": 1,
    "encoder_stages": 1,
    "llm_stages": 1,
}
LLM_CONFIG = {
    "model": "tiny",
    "dataset": "text-heavy",
    "max_pixels": 224 * 224,
    "seed": 0,
    "global_batch": 24,
    "microbatch_size": 4,
}
"""The LLM-dominant set: the built-in ``text-heavy`` generator (half the samples
text-only, long answers; docs/workloads.md) with every image capped at 224 x 224 pixels (at most 64
image tokens), so the tiny LLM's work is about 5x the encoder's (``cpu-tiny``) and varies from sample to
sample (coefficient of variation about 0.8). Microbatches of 4 leave the assignment something to
balance; global batch 24 keeps a launch about as long as the ``skewed`` one (the busiest rank's CPU
time per iteration was about 1.3x ``skewed``'s at global batch 32). No stage counts are given: on 2
processes 1F1B's and DistTrain's planners can only place 1 encoder + 1 LLM stage; Entrain's planner
chooses its layout (``--entrain-layout auto``)."""
BASE_LABELS = {"1f1b": "1F1B", "disttrain": "DistTrain"}


@dataclass(frozen=True)
class Target:
    """``row``'s iteration time at most ``ratio`` x ``base``'s, decided on the paired per-round ratios."""

    row: str
    label: str
    base: str = "1f1b"
    ratio: float = TARGET_RATIO


@dataclass(frozen=True)
class Case:
    """One dataset's benchmark: its ``entrain train`` flags, Entrain's own flags in the shared launch
    (the other systems ignore them), the extension rows (one launch each) and the targets."""

    config: dict
    extension_rows: dict[str, tuple[str, ...]]
    targets: tuple[Target, ...]
    results: str
    """File stem under ``--out``."""
    title: str
    notes: str
    entrain_flags: tuple[str, ...] = ()

    @property
    def rows(self) -> tuple[str, ...]:
        return (*SYSTEMS, *self.extension_rows)


CASES = {
    "skewed": Case(
        CONFIG,
        EXTENSION_ROWS,
        (
            Target("entrain", "Entrain, paper layout (1 + 1)"),
            Target(SHARED, "Entrain, boundary-sharing layout"),
            Target(SPLIT, "Entrain, paper layout, split weight gradients"),
        ),
        "cpu_pipeline",
        "CPU pipeline benchmark",
        f"`entrain` = Entrain on 1 encoder + 1 LLM stage (`{' '.join(PAPER_LAYOUT)}`); `{SHARED}` = Entrain "
        f"with its boundary-sharing layout (ours, not the paper's; `{' '.join(EXTENSION_ROWS[SHARED])}`); "
        f"`{SPLIT}` = Entrain on 1 encoder + 1 LLM stage with every backward run as input then weight gradients "
        f"(ours; `{' '.join(EXTENSION_ROWS[SPLIT])}`); ramp and assignment at `train`'s defaults (auto); 1F1B "
        "and DistTrain use 1 encoder + 1 LLM stage.",
        PAPER_LAYOUT,
    ),
    "text-heavy": Case(
        LLM_CONFIG,
        {"entrain-auto": ("--assignment", "auto"), "entrain-paper": ("--assignment", "paper")},
        (
            Target("entrain", "Entrain, two-resource assignment", "1f1b", 1.0),
            Target("entrain", "Entrain, two-resource assignment", "disttrain", 1.0),
        ),
        "cpu_pipeline_text_heavy",
        "CPU pipeline benchmark, LLM-dominant data",
        "`entrain` = Entrain with `--assignment two-resource` (encoder and LLM work balanced together, then "
        "deferral), in the same launch as 1F1B and DistTrain; `entrain-auto` = `--assignment auto` (per "
        "iteration the cost model's pick, the default) and `entrain-paper` = `--assignment paper` (Algorithm 3, "
        "stratified on encoder work), each its own launch in the same round. Every Entrain row uses Entrain's "
        "default layout and extensions; 1F1B and DistTrain run 1 encoder + 1 LLM stage (their planners' only "
        "layout on 2 processes). Assignment = the per-iteration choices recorded in each plan "
        '(`Plan.options["assignment_chosen"]`).',
        ("--assignment", "two-resource"),
    ),
}
"""``--dataset``: the benchmark cases."""
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def wait_idle(max_wait_s: float) -> tuple[bool, float]:
    """(became idle, last idle fraction): wait until the CPUs are at least 90 % idle."""
    deadline = time.monotonic() + max_wait_s
    idle = cpu_idle_fraction()
    while idle < 0.9 and time.monotonic() < deadline:
        idle = cpu_idle_fraction()
    return idle >= 0.9, idle


def _run_dir(out: str, row: str) -> str:
    """Where a row's run lies: ``out/<system>`` for the systems of the shared launch, ``out/<row>/``
    for an extension row (a one-system launch writes no per-system subfolder)."""
    return os.path.join(out, row)


def round_order(rng: random.Random, case: Case = CASES["skewed"]) -> list[str]:
    """One round's launch order: the shared launch (its systems shuffled, as one ``+``-joined item)
    and the extension launches, shuffled together."""
    systems = rng.sample(SYSTEMS, len(SYSTEMS))
    launches = ["+".join(systems), *case.extension_rows]
    return rng.sample(launches, len(launches))


def launch(out: str, steps: int, order: list[str], case: Case = CASES["skewed"]) -> None:
    for item in order:
        if item in case.extension_rows:
            _launch_one(
                os.path.join(out, item), steps, ("entrain",), *case.extension_rows[item], config=case.config
            )
        else:
            _launch_one(out, steps, item.split("+"), *case.entrain_flags, config=case.config)


def launch_in_stage(out: str, steps: int) -> None:
    _launch_one(os.path.join(out, "1f1b"), steps, ("1f1b",))
    for row, (flags, nproc) in IN_STAGE_ROWS.items():
        _launch_one(os.path.join(out, row), steps, ("1f1b",), *flags, nproc=nproc)


def _launch_one(out: str, steps: int, systems, *extra: str, nproc: int = 2, config: dict = CONFIG) -> None:
    cmd = [
        sys.executable,
        "-m",
        "entrain",
        "train",
        "--system",
        ",".join(systems),
        "--steps",
        str(steps),
        "--out",
        out,
        "--no-progress",
        "--nproc",
        str(nproc),
    ]
    for key, value in config.items():
        cmd += ["--" + key.replace("_", "-"), str(value)]
    subprocess.run([*cmd, *extra], check=True, stdout=subprocess.DEVNULL)


def _stage_std(rows: list[dict]) -> float:
    from entrain.runtime.run_metrics import stage_std_ms

    return statistics.median(stage_std_ms(r["stage_times"]) for r in rows)


def _memory(rows: list[dict]) -> dict:
    """Per rank at the last step: model-state MiB (parameters + gradients + AdamW state, the local
    shards) and peak resident MiB."""
    last = rows[-1].get("memory_per_rank") or []
    mib = 1 << 20
    return {
        "state_mib_per_rank": [
            (m["params_bytes"] + m["grads_bytes"] + m["optimizer_bytes"]) / mib for m in last
        ],
        "peak_rss_mib_per_rank": [m["peak_rss_bytes"] / mib for m in last],
    }


def llm_fwd_std_ms(records: list[dict], num_encoder_stages: int) -> float:
    """The simulator's ``llm_fwd_std_ms``, measured (one replica): per microbatch, the forward ms summed
    over the LLM stages (stage index >= ``num_encoder_stages``) and subs; population std across them."""
    per_mb: dict[int, float] = {}
    for r in records:
        if r["stage"] >= num_encoder_stages:
            per_mb[r["mb"]] = per_mb.get(r["mb"], 0.0) + r["fwd_ms"]
    return statistics.pstdev(per_mb.values()) if len(per_mb) > 1 else 0.0


def measured(out: str, rows_measured=ROWS) -> dict:
    res = {}
    for system in rows_measured:
        with open(os.path.join(_run_dir(out, system), "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f][WARMUP:]
        with open(os.path.join(_run_dir(out, system), "plan.json")) as f:
            encoder_stages = sum(s["component"] == "encoder" for s in json.load(f)["layout"]["stages"])
        res[system] = {
            "iter_ms": statistics.median(r["iteration_time_ms"] for r in rows),
            "stage_std_ms": _stage_std(rows),
            "llm_fwd_std_ms": statistics.median(
                llm_fwd_std_ms(r["stage_times"], encoder_stages) for r in rows
            ),
            "cpu_ms_per_rank": [
                statistics.median(r["cpu_ms"][k] for r in rows) for k in range(len(rows[0]["cpu_ms"]))
            ],
            "loss_last": rows[-1]["loss"],
            **_memory(rows),
        }
    return res


def simulated(out: str, rows_simulated=ROWS) -> dict:
    from entrain.core.costs.presets import build_cost_model
    from entrain.core.ir.plan import Plan
    from entrain.sim.executor import simulate_plan
    from entrain.sim.metrics import compute_metrics

    cost = build_cost_model("tiny", "cpu-tiny")
    res = {}
    for system in rows_simulated:
        with open(os.path.join(_run_dir(out, system), "plan.json")) as f:
            plan = Plan.from_json(json.load(f))
        runs = simulate_plan(plan, cost)[WARMUP:]
        metrics = compute_metrics(plan.layout, runs)
        res[system] = {
            "iter_ms": statistics.median(r.iteration_time_ms for r in runs),
            "encoder_fwd_std_ms": metrics.encoder_fwd_std_ms,
            "llm_fwd_std_ms": metrics.llm_fwd_std_ms,
            "assignment_chosen": assignment_counts(plan.options),
        }
    return res


def assignment_counts(options: dict) -> dict[str, int]:
    """How often each assignment ran over the plan's (iteration, replica) pairs: the choices recorded in
    ``Plan.options["assignment_chosen"]``, or the fixed ``assignment`` option (``{}`` for the baselines)."""
    chosen = options.get("assignment_chosen")
    if chosen is None:
        return {options["assignment"]: 1} if "assignment" in options else {}
    flat = [a for per_replica in chosen for a in per_replica]
    return {a: flat.count(a) for a in sorted(set(flat))}


def paired(launches: list[dict], row: str, base: str = "1f1b", target: float = TARGET_RATIO) -> dict:
    """Per-round ratio of ``row``'s median iteration time to that round's ``base``, with its spread and
    the rounds at or below ``target``."""
    ratios = [run[row]["iter_ms"] / run[base]["iter_ms"] for run in launches]
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
    return {"ratios": ratios, "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "iqr": q[2] - q[0], "base": base, "target": target,
            "rounds_met": sum(r <= target for r in ratios)}  # fmt: skip


def report(
    launches: list[dict],
    sims: dict,
    idle: tuple[bool, float],
    steps: int,
    orders: list,
    case: Case = CASES["skewed"],
) -> str:
    rows = case.rows
    med = {
        s: {
            k: statistics.median(run[s][k] for run in launches)
            for k in ("iter_ms", "stage_std_ms", "llm_fwd_std_ms")
        }
        for s in rows
    }
    cpu = {
        s: [statistics.median(run[s]["cpu_ms_per_rank"][k] for run in launches) for k in range(2)]
        for s in rows
    }
    base = med["1f1b"]
    pair = {s: paired(launches, s) for s in rows}
    lines = [
        f"# {case.title}",
        "",
        f"Config: {json.dumps(case.config)}; {len(launches)} rounds x {steps} steps, first {WARMUP} dropped; "
        f"idle check {'passed' if idle[0] else 'NOT passed'} (CPU idle {idle[1]:.0%} before the first launch).",
        "",
        "| system | iter ms (median) | / 1F1B (medians) | paired / 1F1B: median | min | max | IQR | "
        "stage std ms | / 1F1B | LLM fwd std ms | sim LLM fwd std ms | CPU ms rank 0 / 1 | sim iter ms | sim / 1F1B | "
        "assignment |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        p = pair[s]
        chosen = ", ".join(f"{a} {n}" for a, n in sims[s]["assignment_chosen"].items()) or "-"
        lines.append(
            f"| {s} | {med[s]['iter_ms']:.0f} | {med[s]['iter_ms'] / base['iter_ms']:.3f} | {p['median']:.3f} | "
            f"{p['min']:.3f} | {p['max']:.3f} | {p['iqr']:.3f} | "
            f"{med[s]['stage_std_ms']:.1f} | {med[s]['stage_std_ms'] / max(base['stage_std_ms'], 1e-9):.3f} | "
            f"{med[s]['llm_fwd_std_ms']:.1f} | {sims[s]['llm_fwd_std_ms']:.1f} | "
            f"{cpu[s][0]:.0f} / {cpu[s][1]:.0f} | {sims[s]['iter_ms']:.0f} | "
            f"{sims[s]['iter_ms'] / sims['1f1b']['iter_ms']:.3f} | {chosen} |"
        )
    lines += [
        "",
        "Paired = each round's ratio to the 1F1B of the same round; IQR = its interquartile range. LLM fwd std = "
        "per microbatch the forward ms summed over the LLM stages, std across microbatches (median over steps "
        "and rounds), as the simulator's.",
        "Per round (launch order; iteration ms): "
        + "; ".join(
            f"[{' then '.join(order)}] " + ", ".join(f"{s} {run[s]['iter_ms']:.0f}" for s in rows)
            for order, run in zip(orders, launches)
        ),
        "",
        case.notes,
        "",
    ]
    lines += [target_line(t.label, paired(launches, t.row, t.base, t.ratio)) for t in case.targets]
    return "\n".join(lines) + "\n"


def target_line(label: str, p: dict) -> str:
    """``Target: ...`` with the paired per-round ratios of ``p`` (``paired``) and met / NOT met."""
    met = p["median"] <= p["target"]
    base = BASE_LABELS.get(p["base"], p["base"])
    return (
        f"Target: {label} iteration time <= {p['target']}x {base}'s, paired per round: median {p['median']:.3f} "
        f"(min {p['min']:.3f}, max {p['max']:.3f}, IQR {p['iqr']:.3f}; {p['rounds_met']}/{len(p['ratios'])} "
        f"rounds at or below {p['target']}) -> {'met' if met else 'NOT met'}."
    )


def report_in_stage(launches: list[dict], sims: dict, idle: tuple[bool, float], steps: int) -> str:
    rows = ("1f1b", *IN_STAGE_ROWS)
    med = {s: statistics.median(run[s]["iter_ms"] for run in launches) for s in rows}
    paired = {
        s: statistics.median(run[s]["iter_ms"] / run["1f1b"]["iter_ms"] for run in launches) for s in rows
    }
    procs = {"1f1b": 2, **{r: n for r, (_, n) in IN_STAGE_ROWS.items()}}
    lines = [
        "# CPU pipeline benchmark: parallelism inside the stages",
        "",
        f"Config: {json.dumps(CONFIG)}, system 1f1b; {len(launches)} launches x {steps} steps, first {WARMUP} "
        f"dropped; idle check {'passed' if idle[0] else 'NOT passed'} (CPU idle {idle[1]:.0%} before the first "
        "launch). Every row is one torchrun launch on this 2-core machine, in turn, within each launch set.",
        "",
        "| row | processes | iter ms (median) | / 1F1B | / 1F1B per launch (median) | model state MiB per rank "
        "(params+grads+AdamW, local shards) | peak RSS MiB per rank | sim iter ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        last = launches[-1][s]
        state = " / ".join(f"{x:.1f}" for x in last["state_mib_per_rank"])
        rss = " / ".join(f"{x:.0f}" for x in last["peak_rss_mib_per_rank"])
        lines.append(
            f"| {s} | {procs[s]} | {med[s]:.0f} | {med[s] / med['1f1b']:.3f} | {paired[s]:.3f} | {state} | {rss} | "
            f"{sims[s]['iter_ms']:.0f} |"
        )
    lines += [
        "",
        "Per launch iteration ms: "
        + "; ".join(", ".join(f"{s} {run[s]['iter_ms']:.0f}" for s in rows) for run in launches),
        "",
        "The 4-process rows run 4 single-threaded ranks on 2 cores, so their wall times include time-sharing; "
        "compare `1f1b-dp2-fsdp` with `1f1b-dp2` (same processes and batches: FSDP2 instead of the flat "
        "all-reduce) and read `1f1b-tp2` for its per-rank memory, not its speed. The simulator prices TP from "
        "the Plan's degree and does not model FSDP's gathers.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--max-idle-wait-s", type=float, default=120.0)
    ap.add_argument("--skip-idle-check", action="store_true")
    ap.add_argument("--order-seed", type=int, default=0, help="seed of the per-round launch order")
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument(
        "--dataset",
        choices=sorted({*CASES, *PAIRED_CONFIGS}),
        default="skewed",
        help="skewed or text-heavy: LLM-dominant data, Entrain's two-resource assignment; "
        "with --paired also chartqa, multi-image",
    )
    ap.add_argument(
        "--paired",
        action="store_true",
        help="Entrain (defaults) / 1F1B, encoder-rebalance and DFLOP with traces (cpu_paired.py)",
    )
    ap.add_argument("--profile", default=None, help="--paired: plan both systems with this profile")
    ap.add_argument("--pass-name", default="", help="--paired: suffix of the workload's key in the results")
    ap.add_argument(
        "--keep-runs",
        default=None,
        help="--paired: copy each round's run folders (traces) and the pass's refitted profiles here",
    )
    ap.add_argument(
        "--rescore-joint",
        default=None,
        metavar="DIR",
        help="--paired: add the joint refit's prediction to the recorded pass from the rounds it kept in DIR",
    )
    ap.add_argument(
        "--in-stage", action="store_true", help="the TP 2 / FSDP rows next to 1F1B (IN_STAGE_ROWS)"
    )
    ap.add_argument(
        "--moe-ep",
        action="store_true",
        help="Entrain / 1F1B on a tiny Qwen3-VL-MoE checkpoint at --ep 1 and 2 against the simulator (cpu_moe_ep.py)",
    )
    ap.add_argument(
        "--omni",
        action="store_true",
        help="Entrain (one pipeline per encoder tower) / 1F1B on a tiny Qwen2.5-Omni thinker, 3 processes (cpu_omni.py)",
    )
    ap.add_argument(
        "--note",
        default=None,
        help="--moe-ep, --omni: a note recorded with the pass (e.g. the machine's load)",
    )
    ap.add_argument(
        "--model-path",
        default=None,
        help="--moe-ep: the tiny Qwen3-VL-MoE checkpoint (python -m tests.models.qwen3_vl_moe_tiny DIR writes one); "
        "--omni: a thinker folder (default: cpu_omni.py writes its own)",
    )
    args = ap.parse_args()
    if args.paired and args.rescore_joint:
        return rescore_joint(args)
    idle = (True, 1.0) if args.skip_idle_check else wait_idle(args.max_idle_wait_s)
    if args.moe_ep:
        from cpu_moe_ep import main_moe_ep  # benchmarks/cpu_moe_ep.py

        return main_moe_ep(args, idle)
    if args.omni:
        from cpu_omni import main_omni  # benchmarks/cpu_omni.py

        return main_omni(args, idle)
    if args.in_stage:
        return main_in_stage(args, idle)
    if args.paired:
        return main_paired(args, idle)
    if args.dataset not in CASES:
        ap.error(f"--dataset {args.dataset} needs --paired")
    case = CASES[args.dataset]
    launches, sims, orders = [], {}, []
    rng = random.Random(args.order_seed)
    with tempfile.TemporaryDirectory(prefix="entrain-bench-") as tmp:
        for i in range(args.launches):
            run_dir = os.path.join(tmp, f"launch{i}")
            orders.append(round_order(rng, case))
            launch(run_dir, args.steps, orders[-1], case)
            launches.append(measured(run_dir, case.rows))
            if i == 0:
                sims = simulated(run_dir, case.rows)
    src = source()
    text = stamped(report(launches, sims, idle, args.steps, orders, case), src)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{case.results}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, f"{case.results}.json"), "w") as f:
        json.dump(
            {
                "source": src,
                "config": case.config,
                "entrain_flags": case.entrain_flags,
                "extension_rows": case.extension_rows,
                "launches": launches,
                "orders": orders,
                "order_seed": args.order_seed,
                "paired": {s: paired(launches, s) for s in case.rows},
                "targets": [
                    {"label": t.label, **paired(launches, t.row, t.base, t.ratio)} for t in case.targets
                ],
                "simulated": sims,
                "idle": idle,
            },
            f,
            indent=1,
        )
    print(text)
    return 0


def main_in_stage(args, idle) -> int:
    rows = ("1f1b", *IN_STAGE_ROWS)
    launches, sims = [], {}
    with tempfile.TemporaryDirectory(prefix="entrain-bench-") as tmp:
        for i in range(args.launches):
            run_dir = os.path.join(tmp, f"launch{i}")
            launch_in_stage(run_dir, args.steps)
            launches.append(measured(run_dir, rows))
            if i == 0:
                sims = simulated(run_dir, rows)
    src = source()
    text = stamped(report_in_stage(launches, sims, idle, args.steps), src)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cpu_pipeline_in_stage.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "cpu_pipeline_in_stage.json"), "w") as f:
        json.dump(
            {
                "source": src,
                "config": CONFIG,
                "rows": IN_STAGE_ROWS,
                "launches": launches,
                "simulated": sims,
                "idle": idle,
            },  # fmt: skip
            f,
            indent=1,
        )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
