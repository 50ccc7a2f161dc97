"""The ceiling of any re-plan on ``curriculum``: per phase, the fastest plan of EVERY
encoder/LLM split Algorithm 2 allows at the paper's setup, each as it would run on the phase's batches.

    python benchmarks/replan_ceiling.py --model qwen25vl-llama3-1b --out /tmp/ceiling1
    python benchmarks/replan_ceiling.py --merge /tmp/ceiling1.json /tmp/ceiling3.json   # the md table

Setup and batches: ``benchmarks/replan.py``'s (64 GPUs, DP 4, TP 2, B 512, mb 4, a40-paper, seed 0; a
phase = its first 2 global batches). Candidates: every (E.PP, L.PP) with E.PP + L.PP <= the replica's
16 GPUs / TP 2 (Algorithm 2 also tries floor/ceil stage counts that leave GPUs idle), each with Algorithm
2's min-max layer partition and per-stage recomputation on each phase's samples (the three profiles;
identical plans counted once), with Entrain's schedule options of the first-phase plan. Every plan is judged as deployed on the
phase: the simulated memory check's recomputation where a rank overflows, from the plan's and from
none (``adaptive.WindowJudge``, the re-planner's judge; ``inf`` where nothing fits), pruned by the plan as planned (a lower bound:
``adaptive.fastest``). Against: the static Entrain plans (first phase, whole mix) and the re-planner's
pick on the phase's batches, judged the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from replan import MODELS, degree_label, simulate_args, split_label, table_md

from entrain.cli.common import resolve_cost_model, workload_source
from entrain.config import RunConfig
from entrain.core.planning.config_search import evaluate_config
from entrain.core.planning.setups import SystemSetup, system_setups
from entrain.data.generators import CURRICULUM_PHASES
from entrain.data.sampling import dataset_sampler
from entrain.sim.adaptive import WindowJudge, degree_candidates, fastest, window_replanner


def split_plans(profiles: dict, cost, req, options: dict) -> list[SystemSetup]:
    """Every (E.PP, L.PP) split's plans: Algorithm 2's partition and recomputation on each profile;
    duplicates dropped."""
    stages = req.gpus // req.dp // req.tp
    parallel = dataclasses.replace(req.parallel, dp=req.dp)
    out, seen = [], set()
    for e in range(1, stages):
        for m in range(1, stages - e + 1):
            for name, stats in profiles.items():
                cfg = evaluate_config(stats, cost, parallel, encoder=(req.tp, 1, e), llm=(req.tp, 1, m))
                s = SystemSetup(cfg.to_layout(), dict(options), f"E.PP {e} / L.PP {m}, Algorithm 2 on {name}")
                if repr(s.layout) not in seen:
                    seen.add(repr(s.layout))
                    out.append(s)
    return out


def run_model(model: str, degrees: bool = False) -> dict:
    args = simulate_args(model, 2)
    cost = resolve_cost_model(args)
    batches = list(workload_source(args, cost).batches(args.global_batch, args.iterations))
    phases = {p: batches[2 * i : 2 * i + 2] for i, p in enumerate(CURRICULUM_PHASES)}
    req = dataclasses.replace(RunConfig.from_args(args).config_request(), model=cost.model)
    extra = {"eager_budget_factor": args.eager_budget_factor}
    judge = WindowJudge("entrain", cost, extra)
    t = time.time()
    first_req = dataclasses.replace(req, dataset=CURRICULUM_PHASES[0])
    first = system_setups(["entrain"], first_req, cost, dataset_sampler(CURRICULUM_PHASES[0], args.seed))
    mix = system_setups(["entrain"], req, cost, dataset_sampler("curriculum", args.seed))["entrain"]
    replan = window_replanner("entrain", req, cost, judge)
    profiles = {p: [w.meta for b in bs for w in b] for p, bs in phases.items()}
    plans = split_plans(profiles, cost, req, first["entrain"].options)
    # --degrees: Algorithm 2's best at every other (DP, TP, microbatch size) on the phase's own samples
    others = {p: degree_candidates(first["entrain"], items, cost, req, top=10**6) if degrees else []
             for p, items in profiles.items()}  # fmt: skip
    label = degree_label if degrees else split_label
    out = {"model": MODELS[model], "candidates": len(plans), "phases": {}}
    if degrees:
        out["degree_candidates"] = {p: len(e) for p, e in others.items()}
    for p, bs in phases.items():
        statics = {"first phase": first["entrain"], "whole mix": mix, "re-planner": replan(bs)}
        row = {}
        for name, s in statics.items():
            row[name] = {"ms": judge(s, bs), "split": label(s), "planned_ms": judge.planned(s, bs)}
        best = fastest([*plans, *others[p]], bs, judge, judge.bound)
        row["best"] = {"ms": judge(best, bs), "split": label(best), "source": best.source}
        out["phases"][p] = row
        print(model, p, json.dumps(row), file=sys.stderr, flush=True)
    out["seconds"] = time.time() - t
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODELS, action="append")
    p.add_argument("--out", default="/dev/null")
    p.add_argument("--merge", nargs="*")
    p.add_argument("--degrees", action="store_true",
                   help="also Algorithm 2's best at every other DP / TP / microbatch size (replan.py's degrees section)")  # fmt: skip
    p.add_argument("--commit", default=None, help="the commit the run is at: recorded as its source")
    args = p.parse_args(argv)
    if args.merge is not None:
        cases = [c for f in args.merge for c in json.loads(Path(f).read_text())["cases"]]
        print("\n".join(table_md(cases)))
        return 0
    models = args.model or list(MODELS)
    cases = [run_model(m, args.degrees) for m in models]
    data: dict = {"cases": cases}
    if args.commit:
        flags = " ".join(f"--model {m}" for m in models) + (" --degrees" if args.degrees else "")
        data["source"] = {"commit": args.commit, "command": f"python benchmarks/replan_ceiling.py {flags}"}
    Path(args.out).with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    print("\n".join(table_md(cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
