"""The end-of-step phase, measured offline on kept real CPU runs (nothing trains again).

    python benchmarks/step_end_offline.py --paired NAME=DIR/WORKLOAD[@SOURCE_DIR/WORKLOAD] ...
        --moe NAME=RUNS[@SOURCE_NAME] ... [--out OUT]

The real tiny CPU runs spend 16-41 ms a step outside their traced actions (the loss and gradient-norm
all-reduces, clipping, the optimizer step; at expert parallelism the action check and routing
statistics); the simulator priced none of it, so every simulated ratio between systems was pulled away
from 1. ``entrain profile --from-trace`` now fits it (``HardwareSpec.step_end_ms`` and
``step_end_ms_per_param_byte``: ``entrain.sim.step_end_fit``) and the simulator adds it once per
iteration. For each kept pass, the profiles its benchmark fits, made again by the code at hand, and the
pass's round-0 Plans simulated under each twice: with the fitted end of step ("after") and with it set
to 0 ("before": the same layer fit, what the code before priced), against the pass's real paired ratios
(median over rounds of Entrain's median iteration ms over the baseline's in the same launch).

* ``--paired WORKLOAD=DIR``: a ``cpu_pipeline.py --paired --keep-runs`` pass's rounds (``round0`` ...,
  a run folder per system). Profiles: ``round 0`` (round 0's 1F1B + Entrain traces fitted jointly,
  ``cpu_paired.joint_fit``: how a pass makes the profile the next one plans with; in sample for round
  0) and ``every round`` (every round and system, ``cpu_paired_rescore.joint_profile``); with
  ``@SOURCE``, the kept rounds of the pass whose every-round profile this pass planned with, also
  ``planned`` (that profile fitted again: out of sample).
* ``--moe NAME=RUNS``: a ``cpu_pipeline.py --moe-ep --keep-runs`` pass (``roundN/ep{1,2}/{entrain,1f1b}``).
  Profiles per ep: ``in sample`` (every round's two traces, ``--fit-groups cuts``, as
  ``cpu_moe_ep.joint_profile``) and, with ``@SOURCE_NAME`` (another ``--moe`` pass, whose in-sample
  profile this pass planned with), ``planned`` (out of sample).

Printed; with ``--out OUT``, also ``OUT/step_end_offline.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import replace

from cpu_moe_ep import joint_profile as moe_joint_profile
from cpu_paired import (
    BASE_LABELS,
    BASELINES,
    PASS_SYSTEMS,
    WARMUP,
    iter_ms,
    joint_fit,
    load_cost,
    simulated_ms,
)
from cpu_paired_rescore import joint_profile, kept_rounds
from provenance import source, stamped

STEM = "step_end_offline"
MOE_SYSTEMS = ("entrain", "1f1b")
EPS = ("1", "2")


def without_end(cost):
    """``cost`` with no end-of-step phase: what the simulator priced before."""
    return replace(cost, hardware=replace(cost.hardware, step_end_ms=0.0, step_end_ms_per_param_byte=0.0))


def real_ratios(rounds: list[str], base: str, systems_of=lambda r: r) -> list[float]:
    """Per round: Entrain's median iteration ms over ``base``'s (``systems_of(round)``: the folder holding
    the systems' run folders)."""
    return [
        iter_ms(os.path.join(systems_of(r), "entrain")) / iter_ms(os.path.join(systems_of(r), base))
        for r in rounds
    ]


def outside_ms(run: str) -> float:
    """The run's median time outside its traced actions per kept step (iteration ms - traced span)."""
    with open(os.path.join(run, "trace.json")) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    with open(os.path.join(run, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()][WARMUP:]
    out = []
    for row in rows:
        mine = [e for e in events if e["args"]["step"] == row["step"]]
        span = (max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)) / 1e3
        out.append(row["iteration_time_ms"] - span)
    return statistics.median(out)


def simulate_both(first: str, systems, profile: str) -> dict:
    """Round ``first``'s Plans of ``systems`` simulated under ``profile`` with and without its end of step."""
    cost = load_cost("", profile)
    return {
        "after": {s: simulated_ms(os.path.join(first, s), cost) for s in systems},
        "before": {s: simulated_ms(os.path.join(first, s), without_end(cost)) for s in systems},
        "step_end_ms": cost.hardware.step_end_ms,
        "step_end_ms_per_param_byte": cost.hardware.step_end_ms_per_param_byte,
    }


def _scored(sim: dict, real: dict[str, float], bases) -> dict:
    out = {}
    for b in bases:
        row = {"real_ratio": real[b]}
        for when in ("before", "after"):
            ratio = sim[when]["entrain"] / sim[when][b]
            row[f"{when}_ratio"], row[f"{when}_rel_error"] = ratio, ratio / real[b] - 1
        out[b] = row
    return out


def paired(name: str, folder: str, source_dir: str | None, tmp: str) -> dict:
    rounds = kept_rounds(folder)
    real = {b: statistics.median(real_ratios(rounds, b)) for b in BASELINES}
    profiles = {
        "round 0": joint_fit(rounds[0], os.path.join(tmp, f"{name}.r0.json"), f"{name} round 0"),
        "every round": joint_profile(rounds, os.path.join(tmp, f"{name}.all.json"), name),
    }
    if source_dir:
        src = kept_rounds(source_dir)
        profiles["planned"] = joint_profile(src, os.path.join(tmp, f"{name}.src.json"), f"source of {name}")
    res = {
        "rounds": len(rounds),
        "outside_ms": {
            s: statistics.median(outside_ms(os.path.join(r, s)) for r in rounds) for s in PASS_SYSTEMS
        },
        "profiles": {},
    }
    for label, path in profiles.items():
        sim = simulate_both(rounds[0], PASS_SYSTEMS, path)
        res["profiles"][label] = {
            "step_end_ms": sim["step_end_ms"],
            "step_end_ms_per_param_byte": sim["step_end_ms_per_param_byte"],
            "sim_ms": {"before": sim["before"], "after": sim["after"]},
            "pairs": _scored(sim, real, BASELINES),
        }
    return res


def moe(passes: dict[str, tuple[str, str | None]], tmp: str) -> dict:
    """Per pass (name -> (kept rounds, the name of the pass whose in-sample profile it planned with))."""
    out: dict = {}
    fitted: dict[tuple[str, str], str] = {}
    for name, (folder, _) in passes.items():
        rounds = kept_rounds(folder)
        for ep in EPS:
            runs = [os.path.join(r, f"ep{ep}", s) for s in ("1f1b", "entrain") for r in rounds]
            path = os.path.join(tmp, f"{name}.ep{ep}.joint.json")
            moe_joint_profile(runs, path, f"{name} ep {ep}")
            fitted[(name, ep)] = path
    for name, (folder, planned_with) in passes.items():
        rounds = kept_rounds(folder)
        res = {"rounds": len(rounds), "per_ep": {}}
        for ep in EPS:
            at = lambda r, ep=ep: os.path.join(r, f"ep{ep}")  # noqa: E731
            real = {"1f1b": statistics.median(real_ratios(rounds, "1f1b", at))}
            row = {
                "outside_ms": {
                    s: statistics.median(outside_ms(os.path.join(at(r), s)) for r in rounds)
                    for s in MOE_SYSTEMS
                },
                "profiles": {},
            }
            profiles = [("in sample", fitted[(name, ep)])]
            if planned_with:
                profiles.append((f"planned ({planned_with}, in sample)", fitted[(planned_with, ep)]))
            for label, path in profiles:
                sim = simulate_both(at(rounds[0]), MOE_SYSTEMS, path)
                row["profiles"][label] = {
                    "step_end_ms": sim["step_end_ms"],
                    "step_end_ms_per_param_byte": sim["step_end_ms_per_param_byte"],
                    "sim_ms": {"before": sim["before"], "after": sim["after"]},
                    **_scored(sim, real, ("1f1b",))["1f1b"],
                }
            res["per_ep"][ep] = row
        out[name] = res
    return out


def report(res: dict) -> str:
    lines = [
        "# The end-of-step phase, offline on kept real CPU runs: simulated ratios before and after",
        "",
        "Generated by `benchmarks/step_end_offline.py` (module docstring): each kept pass's profiles fitted "
        "again by the code at the source commit, the pass's round-0 Plans simulated with the fitted end of "
        "step (after) and with it set to 0 (before: the same layer fit, what the simulator priced until "
        "then), against the pass's real paired ratio (median over rounds). Error = sim / real - 1. "
        "Outside = median ms per step outside the traced actions (iteration ms - traced span), per system.",
        "",
    ]
    if res.get("paired"):
        lines += [
            "## Paired passes (Entrain / baseline)",
            "",
            "| workload | profile | end of step fitted | baseline | real ratio | before (error) | after (error) |",
            "|---|---|---|---|---|---|---|",
        ]
        for w, r in res["paired"].items():
            for label, p in r["profiles"].items():
                fit = f"{p['step_end_ms']:.1f} ms + {p['step_end_ms_per_param_byte'] * 1e6:.2f} ms/MB"
                for b, x in p["pairs"].items():
                    lines.append(
                        f"| {w} | {label} | {fit} | {BASE_LABELS[b]} | {x['real_ratio']:.3f} | "
                        f"{x['before_ratio']:.3f} ({x['before_rel_error']:+.1%}) | "
                        f"{x['after_ratio']:.3f} ({x['after_rel_error']:+.1%}) |"
                    )
        lines += [""]
        for w, r in res["paired"].items():
            parts = ", ".join(f"{s} {ms:.1f}" for s, ms in r["outside_ms"].items())
            lines.append(f"- {w} ({r['rounds']} rounds): outside ms {parts}")
        lines += [""]
    if res.get("moe"):
        lines += [
            "## MoE passes (Entrain / 1F1B)",
            "",
            "| pass | ep | profile | end of step fitted | real ratio | before (error) | after (error) |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, r in res["moe"].items():
            for ep, row in r["per_ep"].items():
                for label, p in row["profiles"].items():
                    fit = f"{p['step_end_ms']:.1f} ms + {p['step_end_ms_per_param_byte'] * 1e6:.2f} ms/MB"
                    lines.append(
                        f"| {name} | {ep} | {label} | {fit} | {p['real_ratio']:.3f} | "
                        f"{p['before_ratio']:.3f} ({p['before_rel_error']:+.1%}) | "
                        f"{p['after_ratio']:.3f} ({p['after_rel_error']:+.1%}) |"
                    )
        lines += [""]
        for name, r in res["moe"].items():
            for ep, row in r["per_ep"].items():
                parts = ", ".join(f"{s} {ms:.1f}" for s, ms in row["outside_ms"].items())
                lines.append(f"- {name} ep {ep} ({r['rounds']} rounds): outside ms {parts}")
        lines += [""]
    if res.get("note"):
        lines += [f"Note: {res['note']}", ""]
    return stamped("\n".join(lines), res["source"])


def _pairs(items: list[str], flag: str) -> dict[str, tuple[str, str | None]]:
    """NAME=FOLDER[@SOURCE] items: name -> (folder, source or None)."""
    out = {}
    for item in items:
        name, sep, rest = item.partition("=")
        folder, _, src = rest.partition("@")
        if not sep or not os.path.isdir(folder):
            raise SystemExit(f"{flag} {item!r}: want NAME=FOLDER[@SOURCE] of kept rounds")
        out[name] = (folder, src or None)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--paired", nargs="*", default=[], help="WORKLOAD=DIR/WORKLOAD of a paired pass's kept rounds"
    )
    ap.add_argument("--moe", nargs="*", default=[], help="PASS=RUNS of a --moe-ep pass's kept rounds")
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default=None, help="also write step_end_offline.{json,md} there")
    args = ap.parse_args(argv)
    paired_dirs, moe_dirs = _pairs(args.paired, "--paired"), _pairs(args.moe, "--moe")
    for name, (_, src) in moe_dirs.items():
        if src and src not in moe_dirs:
            raise SystemExit(f"--moe {name}=...@{src}: {src} is no --moe pass of this command")
    stamp = source()
    folders = [
        p for d in (paired_dirs, moe_dirs) for f, s in d.values() for p in (f, s) if p and os.path.isdir(p)
    ]
    for folder in sorted(folders, key=len, reverse=True):
        stamp["command"] = stamp["command"].replace(
            folder, "DIR/" + os.path.basename(os.path.normpath(folder))
        )
    with tempfile.TemporaryDirectory(prefix="entrain-step-end-") as tmp:
        res = {
            "source": stamp,
            "paired": {w: paired(w, d, s, tmp) for w, (d, s) in paired_dirs.items()},
            "moe": moe(moe_dirs, tmp) if moe_dirs else {},
        }
    if args.note:
        res["note"] = args.note
    text = report(res)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"{STEM}.json"), "w") as f:
            json.dump(res, f, indent=1)
        with open(os.path.join(args.out, f"{STEM}.md"), "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
