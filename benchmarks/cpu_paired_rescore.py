"""Re-score a recorded ``cpu_pipeline.py --paired`` pass from the round folders it kept, running nothing again.

``python benchmarks/cpu_paired_rescore.py --key KEY --rounds DIR/WORKLOAD [--source DIR2/WORKLOAD [--planned]]``:
``KEY`` is the pass's key in ``benchmarks/results/cpu_pipeline_paired.json`` (``WORKLOAD (PASS NAME)``),
``--rounds`` the folder its ``--keep-runs DIR`` kept (``round0`` ... each with a run folder per system:
``plan.json``, ``trace.json``, ``metrics.jsonl``). Three checks per pass, each added to the JSON's
``rescore`` key and its section of the ``.md`` (after the paired tables, as ``cpu_omni.py``'s):

* **Replay**: every kept step of every run simulated (``entrain.sim.executor.run_iteration``, the run's
  Plan) with each compute action lasting what the trace measured, plus the run's measured overhead per
  compute action outside the actions (gaps, send posts, a receive's own cost:
  ``entrain.sim.trace_fit.action_overhead_ms``, what a refit charges). What is left between the replay
  and the real step is the simulator's execution model (dependencies, transfers, waits, a rank holding
  an encoder and an LLM stage), not its prices: per system, replay / traced span - 1; per pair, the
  replayed paired ratio (plus each run's measured time outside the traced span: optimizer step, gradient
  clipping, metrics) against the real one.
* **Spread**: the real paired ratio is the median over rounds; a 90 % bootstrap interval of that median
  (``median_interval``, rounds resampled) and the error range it gives the recorded simulated ratio.
* **Re-score** (with ``--source``): the pass's round-0 Plans simulated under one profile fitted jointly
  to every kept round of every system of the pass whose profile the pass planned with (``entrain profile
  --from-trace ... --also-trace ...``, ``kinds``), against the same real ratios. The recorded sim ratio
  used round 0's 1F1B and Entrain traces only. A re-score, not the pass: the Plans stay those planned
  with the round-0 profile.
* **Planned re-fit** (with ``--source`` and ``--planned``): the profile the pass planned with, round 0's
  1F1B and Entrain traces of ``--source`` fitted jointly (``cpu_paired.joint_fit``, as the pass made it),
  fitted again by the code at hand, and the pass's round-0 Plans simulated under it: the recorded sim
  ratio as the current refit gives it, for the same Plans (a refit that would have priced a Plan
  differently may also have planned differently: not re-planned here).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile

from cpu_paired import (
    BASE_LABELS,
    BASELINES,
    PASS_SYSTEMS,
    RESULTS,
    STEM,
    WARMUP,
    load_cost,
    render,
    simulated_ms,
)
from provenance import source

KEY = "rescore"
DRAWS = 2000
LEVEL = 0.9


def kept_rounds(folder: str) -> list[str]:
    """The ``roundN`` folders of ``folder``, in round order."""
    names = [n for n in os.listdir(folder) if n.startswith("round") and n[5:].isdigit()]
    return [os.path.join(folder, n) for n in sorted(names, key=lambda n: int(n[5:]))]


def median_interval(
    ratios: list[float], seed: int = 0, draws: int = DRAWS, level: float = LEVEL
) -> tuple[float, float]:
    """The central ``level`` bootstrap interval of the median of ``ratios`` (resampled with replacement)."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    tail = (1.0 - level) / 2
    return meds[int(tail * draws)], meds[min(draws - 1, int((1.0 - tail) * draws))]


def _events(run: str) -> list[dict]:
    with open(os.path.join(run, "trace.json")) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _iteration_ms(run: str) -> list[float]:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line)["iteration_time_ms"] for line in f if line.strip()]


def _cost_of(spec: dict):
    from entrain.cli.plot_trace import run_model_config

    return run_model_config(spec).cost_model()


def _dir(path: str) -> str:
    """``path`` as the results name it: ``DIR/`` and its last two parts (no machine paths)."""
    return "DIR/" + "/".join(os.path.abspath(path).split(os.sep)[-2:])


def replay(run: str, overhead_ms: float | None = None) -> list[dict]:
    """Per kept step of ``run``: ``replay_ms`` (its Plan simulated with the traced compute durations plus
    ``overhead_ms`` per compute action; default: the run's measured overhead, as a refit charges it),
    ``span_ms`` (first traced action's start to last one's end) and ``iteration_ms`` (metrics.jsonl)."""
    from entrain.core.ir.plan import Plan
    from entrain.core.schedules.action_costs import PlanCosts
    from entrain.sim.executor import run_iteration
    from entrain.sim.trace_fit import action_overhead_ms, load_run, rank_overheads

    if overhead_ms is None:
        traced = load_run(run, _cost_of)
        overhead_ms = action_overhead_ms(traced, rank_overheads(traced))
    with open(os.path.join(run, "plan.json")) as f:
        plan = Plan.from_json(json.load(f))
    with open(os.path.join(run, "config.json")) as f:
        cost = _cost_of(json.load(f)["spec"])
    events, iters = _events(run), _iteration_ms(run)

    class Measured(PlanCosts):
        table: dict = {}

        def compute_ms(self, stage, kind, ids):
            return self.table[(stage, kind.value, tuple(ids))] + overhead_ms

    out = []
    for step in range(WARMUP, len(plan.iterations)):
        it, mine = plan.iterations[step], [e for e in events if e["args"]["step"] == step]
        costs = Measured(plan.layout, cost, plan.samples)
        costs.table = {}
        for e in mine:
            a = e["args"]
            if e["cat"] != "compute":
                continue
            replica, _ = plan.layout.replica_of(e["pid"])
            mb = it.microbatches[replica][a["mb"]]
            subs = mb.encoder_subs if plan.layout.stages[a["stage"]].component == "encoder" else mb.llm_subs
            costs.table[(a["stage"], a["kind"], tuple(subs[a["sub"]]))] = e["dur"] / 1e3
        span = (max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)) / 1e3
        ms = run_iteration(plan.layout, it, costs).iteration_time_ms
        out.append({"replay_ms": ms, "span_ms": span, "iteration_ms": iters[step]})
    return out


def joint_profile(rounds: list[str], out: str, label: str) -> str:
    """``entrain profile --from-trace`` over every system of every round in ``rounds`` (one joint fit,
    ``kinds``), written to ``out``; its notes name the runs by ``label``."""
    from cpu_paired import profile_labelled

    runs = [os.path.join(r, s) for r in rounds for s in PASS_SYSTEMS if os.path.isdir(os.path.join(r, s))]
    cmd = [sys.executable, "-m", "entrain", "profile", "--from-trace", runs[0], "--out", out]
    for r in runs[1:]:
        cmd += ["--also-trace", r]
    profile_labelled(
        cmd, out, [f"{label}, {os.path.basename(os.path.dirname(r))}/{os.path.basename(r)}" for r in runs]
    )
    return out


def planned_refit(source_dir: str, first: str, out: str, label: str) -> dict[str, float]:
    """Median simulated ms of round ``first``'s Plans per system under the joint refit of the 1F1B and
    Entrain runs of ``source_dir``'s round 0 (``cpu_paired.joint_fit``, written to ``out``)."""
    from cpu_paired import joint_fit

    cost = load_cost("", joint_fit(kept_rounds(source_dir)[0], out, f"round 0 of {label}"))
    return {s: simulated_ms(os.path.join(first, s), cost) for s in PASS_SYSTEMS}


def rescore(
    recorded: dict, rounds_dir: str, source_dir: str | None, profiles: str, label: str, planned: bool = False
) -> dict:
    """The checks (module docstring) of the recorded pass ``recorded`` from ``rounds_dir``."""
    rounds = kept_rounds(rounds_dir)
    runs = {s: [os.path.join(r, s) for r in rounds] for s in PASS_SYSTEMS}
    replays = {s: [replay(r) for r in runs[s]] for s in PASS_SYSTEMS}

    def per_round(s: str, field: str, outside: bool = False) -> list[float]:
        return [
            statistics.median(x[field] + (x["iteration_ms"] - x["span_ms"] if outside else 0.0) for x in rows)
            for rows in replays[s]
        ]

    res = {
        "rounds": len(rounds),
        "replay_over_span": {
            s: statistics.median(x["replay_ms"] / x["span_ms"] for rows in replays[s] for x in rows) - 1
            for s in PASS_SYSTEMS
        },
        "outside_ms": {
            s: statistics.median(per_round(s, "iteration_ms")) - statistics.median(per_round(s, "span_ms"))
            for s in PASS_SYSTEMS
        },
        "pairs": {},
    }
    if source_dir:
        first = rounds[0]
        path = joint_profile(
            kept_rounds(source_dir), os.path.join(profiles, f"{STEM}_rescore_{label}.joint.json"), label
        )
        cost = load_cost("", path)
        res["sim_ms"] = {s: simulated_ms(os.path.join(first, s), cost) for s in PASS_SYSTEMS}
        res["source_runs"] = len(kept_rounds(source_dir)) * len(PASS_SYSTEMS)
    if source_dir and planned:
        res["planned_sim_ms"] = planned_refit(
            source_dir,
            rounds[0],
            os.path.join(profiles, f"{STEM}_rescore_{label}.planned.json"),
            label,
        )
    replayed = {s: per_round(s, "replay_ms", outside=True) for s in PASS_SYSTEMS}
    for b in BASELINES:
        p = recorded["pairs"][b]
        real, sim = p["real_ratio"], p["sim_ratio"]
        lo, hi = median_interval(p["ratios"])
        row = {
            "real_ratio": real,
            "real_interval": [lo, hi],
            "sim_ratio": sim,
            "sim_rel_error": sim / real - 1,
            "error_range": [sim / hi - 1, sim / lo - 1],
            "replay_ratio": statistics.median(e / x for e, x in zip(replayed["entrain"], replayed[b])),
        }
        row["replay_rel_error"] = row["replay_ratio"] / real - 1
        if source_dir:
            row["rescore_sim_ratio"] = res["sim_ms"]["entrain"] / res["sim_ms"][b]
            row["rescore_rel_error"] = row["rescore_sim_ratio"] / real - 1
        if "planned_sim_ms" in res:
            row["planned_refit_sim_ratio"] = res["planned_sim_ms"]["entrain"] / res["planned_sim_ms"][b]
            row["planned_refit_rel_error"] = row["planned_refit_sim_ratio"] / real - 1
        res["pairs"][b] = row
    return res


def report(rescores: dict) -> str:
    """The ``rescore`` section of ``cpu_pipeline_paired.md``."""
    lines = [
        "",
        "## Re-scored from the kept rounds (`benchmarks/cpu_paired_rescore.py`)",
        "",
        "Nothing here ran again: each row reads a recorded pass's kept round folders. Replay = the pass's Plans "
        "simulated with every compute action as long as its trace measured (plus the run's measured overhead per action, "
        "and each run's measured time outside its traced actions), against the real paired ratio: what the simulator's "
        "execution model alone gets wrong. Real 90 % = bootstrap interval of the median over rounds; error range = the "
        "recorded sim ratio's error over that interval. Re-score = the same round-0 Plans simulated under one joint refit of "
        "every kept round and system of the pass the profile came from (the recorded sim ratio: round 0's 1F1B and Entrain "
        "traces of that pass); a re-score of Plans planned with the round-0 profile, not a new pass. Planned re-fit = "
        "the profile the pass planned with (round 0's 1F1B and Entrain traces of that pass, fitted jointly) fitted again "
        "by the code at the row's commit, the same round-0 Plans simulated under it: the recorded sim ratio as that code's "
        "refit prices it (not re-planned).",
        "",
        "| pass | baseline | real ratio (90 %) | recorded sim (error, range) | replay (error) | re-score sim (error) "
        "| planned re-fit sim (error) |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, r in rescores.items():
        for b, p in r["pairs"].items():
            lo, hi = p["real_interval"]
            rescored = (
                f"{p['rescore_sim_ratio']:.3f} ({p['rescore_rel_error']:+.1%})"
                if "rescore_sim_ratio" in p
                else "-"
            )
            planned = (
                f"{p['planned_refit_sim_ratio']:.3f} ({p['planned_refit_rel_error']:+.1%})"
                if "planned_refit_sim_ratio" in p
                else "-"
            )
            lines.append(
                f"| {key} | {BASE_LABELS[b]} | {p['real_ratio']:.3f} ({lo:.3f}-{hi:.3f}) | {p['sim_ratio']:.3f} "
                f"({p['sim_rel_error']:+.1%}, {p['error_range'][0]:+.1%} to {p['error_range'][1]:+.1%}) | "
                f"{p['replay_ratio']:.3f} ({p['replay_rel_error']:+.1%}) | {rescored} | {planned} |"
            )
    lines += [
        "",
        "Replay / traced span - 1 per system, and the median time outside the traced actions per iteration:",
        "",
    ]
    for key, r in rescores.items():
        parts = ", ".join(
            f"{s} {r['replay_over_span'][s]:+.1%} ({r['outside_ms'][s]:.0f} ms)" for s in PASS_SYSTEMS
        )
        src = f"; re-score profile from {r['source_runs']} runs" if "source_runs" in r else ""
        lines.append(f"- {key}: {parts}{src} ({r['source']['commit']})")
    if any(r.get("note") for r in rescores.values()):
        lines += [""] + [f"Note ({k}): {r['note']}" for k, r in rescores.items() if r.get("note")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--key", required=True, help="the pass's key in cpu_pipeline_paired.json")
    ap.add_argument("--rounds", required=True, help="its kept rounds: DIR/WORKLOAD of --keep-runs DIR")
    ap.add_argument("--source", help="kept rounds of the pass whose joint refit it planned with (re-score)")
    ap.add_argument(
        "--planned",
        action="store_true",
        help="with --source: also re-fit the profile the pass planned with (--source's round 0, 1F1B + Entrain)",
    )
    ap.add_argument(
        "--profiles", default=None, help="where the re-score's profile goes (default: a temporary folder)"
    )
    ap.add_argument("--note", default="", help="a note for the pass's row")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    if args.planned and not args.source:
        ap.error("--planned needs --source (the pass whose round 0 the profile was fitted on)")
    path = os.path.join(args.out, f"{STEM}.json")
    with open(path) as f:
        recorded = json.load(f)
    label = args.key.split(" ")[0] + ("-" + os.path.basename(os.path.dirname(os.path.abspath(args.rounds))))
    with tempfile.TemporaryDirectory(prefix="entrain-rescore-") as tmp:
        res = rescore(
            recorded["results"][args.key], args.rounds, args.source, args.profiles or tmp, label, args.planned
        )
    src = source()
    command = src["command"]
    for given in (args.rounds, args.source, args.profiles):
        if given:
            command = command.replace(given, _dir(given))
    res["source"] = {"commit": src["commit"], "command": command}
    if args.note:
        res["note"] = args.note
    recorded.setdefault(KEY, {})[args.key] = res
    recorded.setdefault("sections", {})[KEY] = report(recorded[KEY])
    with open(path, "w") as f:
        json.dump(recorded, f, indent=1)
    text = render(recorded)
    with open(os.path.join(args.out, f"{STEM}.md"), "w") as f:
        f.write(text)
    print(recorded["sections"][KEY])
    return 0


if __name__ == "__main__":
    sys.exit(main())
