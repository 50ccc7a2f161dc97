"""Requirement 8: Entrain vs 1F1B vs DistTrain, really trained on this CPU (issue 4).

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

    python benchmarks/cpu_pipeline.py [--launches 3] [--steps 7] [--order-seed 0] [--skip-idle-check] [--in-stage]

``--in-stage`` (issue 14) instead measures parallelism inside the stages next to plain 1F1B: 1F1B with
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

from idle import cpu_idle_fraction  # benchmarks/idle.py (scripts run from this folder)

SYSTEMS = ("entrain", "1f1b", "disttrain")
SHARED = "entrain-shared"
"""Entrain with its boundary-sharing layout (our extension): the same 2 processes, but one min-max
partition of the encoder-then-LLM layers over them instead of 1 encoder + 1 LLM stage."""
SPLIT = "entrain-split"
"""Entrain, paper layout, every backward as input then weight gradients (our extension)."""
EXTENSION_ROWS = {
    SHARED: ("--entrain-layout", "shared"),
    SPLIT: ("--split-weight-grads", "on"),
}
"""Extra Entrain launches: row -> ``entrain train`` flags (each run in its own subfolder)."""
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
"""Requirement 8: Entrain's iteration time at most this fraction of 1F1B's (paired per round)."""
CONFIG = {
    "model": "tiny",
    "dataset": "skewed",
    "seed": 0,
    "global_batch": 16,
    "microbatch_size": 1,
    "encoder_stages": 1,
    "llm_stages": 1,
}
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


def round_order(rng: random.Random) -> list[str]:
    """One round's launch order: the shared launch (its systems shuffled, as one ``+``-joined item)
    and the extension launches, shuffled together."""
    systems = rng.sample(SYSTEMS, len(SYSTEMS))
    launches = ["+".join(systems), *EXTENSION_ROWS]
    return rng.sample(launches, len(launches))


def launch(out: str, steps: int, order: list[str]) -> None:
    for item in order:
        if item in EXTENSION_ROWS:
            _launch_one(os.path.join(out, item), steps, ("entrain",), *EXTENSION_ROWS[item])
        else:
            _launch_one(out, steps, item.split("+"))


def launch_in_stage(out: str, steps: int) -> None:
    _launch_one(os.path.join(out, "1f1b"), steps, ("1f1b",))
    for row, (flags, nproc) in IN_STAGE_ROWS.items():
        _launch_one(os.path.join(out, row), steps, ("1f1b",), *flags, nproc=nproc)


def _launch_one(out: str, steps: int, systems, *extra: str, nproc: int = 2) -> None:
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
    for key, value in CONFIG.items():
        cmd += ["--" + key.replace("_", "-"), str(value)]
    subprocess.run([*cmd, *extra], check=True, stdout=subprocess.DEVNULL)


def _stage_std(rows: list[dict]) -> float:
    from entrain.runtime.session import stage_std_ms

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


def measured(out: str, rows_measured=ROWS) -> dict:
    res = {}
    for system in rows_measured:
        with open(os.path.join(_run_dir(out, system), "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f][WARMUP:]
        res[system] = {
            "iter_ms": statistics.median(r["iteration_time_ms"] for r in rows),
            "stage_std_ms": _stage_std(rows),
            "cpu_ms_per_rank": [
                statistics.median(r["cpu_ms"][k] for r in rows) for k in range(len(rows[0]["cpu_ms"]))
            ],
            "loss_last": rows[-1]["loss"],
            **_memory(rows),
        }
    return res


def simulated(out: str, rows_simulated=ROWS) -> dict:
    from entrain.core.plan import Plan
    from entrain.core.presets import build_cost_model
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
        }
    return res


def paired(launches: list[dict], row: str) -> dict:
    """Per-round ratio of ``row``'s median iteration time to that round's 1F1B, with its spread."""
    ratios = [run[row]["iter_ms"] / run["1f1b"]["iter_ms"] for run in launches]
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
    return {"ratios": ratios, "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "iqr": q[2] - q[0], "rounds_met": sum(r <= TARGET_RATIO for r in ratios)}  # fmt: skip


def report(launches: list[dict], sims: dict, idle: tuple[bool, float], steps: int, orders: list) -> str:
    med = {
        s: {k: statistics.median(run[s][k] for run in launches) for k in ("iter_ms", "stage_std_ms")}
        for s in ROWS
    }
    cpu = {
        s: [statistics.median(run[s]["cpu_ms_per_rank"][k] for run in launches) for k in range(2)]
        for s in ROWS
    }
    base = med["1f1b"]
    pair = {s: paired(launches, s) for s in ROWS}
    lines = [
        "# CPU pipeline benchmark (issue 4, requirement 8)",
        "",
        f"Config: {json.dumps(CONFIG)}; {len(launches)} rounds x {steps} steps, first {WARMUP} dropped; "
        f"idle check {'passed' if idle[0] else 'NOT passed'} (CPU idle {idle[1]:.0%} before the first launch).",
        "",
        "| system | iter ms (median) | / 1F1B (medians) | paired / 1F1B: median | min | max | IQR | "
        "stage std ms | / 1F1B | CPU ms rank 0 / 1 | sim iter ms | sim / 1F1B |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in ROWS:
        p = pair[s]
        lines.append(
            f"| {s} | {med[s]['iter_ms']:.0f} | {med[s]['iter_ms'] / base['iter_ms']:.3f} | {p['median']:.3f} | "
            f"{p['min']:.3f} | {p['max']:.3f} | {p['iqr']:.3f} | "
            f"{med[s]['stage_std_ms']:.1f} | {med[s]['stage_std_ms'] / max(base['stage_std_ms'], 1e-9):.3f} | "
            f"{cpu[s][0]:.0f} / {cpu[s][1]:.0f} | {sims[s]['iter_ms']:.0f} | "
            f"{sims[s]['iter_ms'] / sims['1f1b']['iter_ms']:.3f} |"
        )
    lines += [
        "",
        "Paired = each round's ratio to the 1F1B of the same round; IQR = its interquartile range.",
        "Per round (launch order; iteration ms): "
        + "; ".join(
            f"[{' then '.join(order)}] " + ", ".join(f"{s} {run[s]['iter_ms']:.0f}" for s in ROWS)
            for order, run in zip(orders, launches)
        ),
        "",
        f"`{SHARED}` = Entrain with its boundary-sharing layout (ours, not the paper's; "
        f"`entrain train --entrain-layout shared`); `{SPLIT}` = Entrain on 1 encoder + 1 LLM stage with every "
        "backward run as input then weight gradients (ours; `--split-weight-grads on`); the other rows use "
        "1 encoder + 1 LLM stage.",
        "",
    ]
    lines += [target_line(row, label, pair[row]) for row, label in (
        ("entrain", "Entrain, paper layout (1 + 1)"),
        (SHARED, "Entrain, boundary-sharing layout"),
        (SPLIT, "Entrain, paper layout, split weight gradients"),
    )]  # fmt: skip
    return "\n".join(lines) + "\n"


def target_line(row: str, label: str, p: dict) -> str:
    met = p["median"] <= TARGET_RATIO
    return (
        f"Target: {label} iteration time <= {TARGET_RATIO}x 1F1B's, paired per round: median {p['median']:.3f} "
        f"(min {p['min']:.3f}, max {p['max']:.3f}, IQR {p['iqr']:.3f}; {p['rounds_met']}/{len(p['ratios'])} "
        f"rounds at or below {TARGET_RATIO}) -> {'met' if met else 'NOT met'}."
    )


def report_in_stage(launches: list[dict], sims: dict, idle: tuple[bool, float], steps: int) -> str:
    rows = ("1f1b", *IN_STAGE_ROWS)
    med = {s: statistics.median(run[s]["iter_ms"] for run in launches) for s in rows}
    paired = {
        s: statistics.median(run[s]["iter_ms"] / run["1f1b"]["iter_ms"] for run in launches) for s in rows
    }
    procs = {"1f1b": 2, **{r: n for r, (_, n) in IN_STAGE_ROWS.items()}}
    lines = [
        "# CPU pipeline benchmark: parallelism inside the stages (issue 14, requirement 5)",
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
        "--in-stage", action="store_true", help="the TP 2 / FSDP rows next to 1F1B (IN_STAGE_ROWS)"
    )
    args = ap.parse_args()
    idle = (True, 1.0) if args.skip_idle_check else wait_idle(args.max_idle_wait_s)
    if args.in_stage:
        return main_in_stage(args, idle)
    launches, sims, orders = [], {}, []
    rng = random.Random(args.order_seed)
    with tempfile.TemporaryDirectory(prefix="entrain-bench-") as tmp:
        for i in range(args.launches):
            run_dir = os.path.join(tmp, f"launch{i}")
            orders.append(round_order(rng))
            launch(run_dir, args.steps, orders[-1])
            launches.append(measured(run_dir))
            if i == 0:
                sims = simulated(run_dir)
    text = report(launches, sims, idle, args.steps, orders)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cpu_pipeline.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "cpu_pipeline.json"), "w") as f:
        json.dump(
            {
                "config": CONFIG,
                "launches": launches,
                "orders": orders,
                "order_seed": args.order_seed,
                "paired": {s: paired(launches, s) for s in ROWS},
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
    text = report_in_stage(launches, sims, idle, args.steps)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cpu_pipeline_in_stage.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "cpu_pipeline_in_stage.json"), "w") as f:
        json.dump(
            {"config": CONFIG, "rows": IN_STAGE_ROWS, "launches": launches, "simulated": sims, "idle": idle},
            f,
            indent=1,
        )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
