"""Entrain's ``expert_assignment`` decision on a mixture-of-experts LLM, in simulation: the assignment
weighing each sample's predicted busiest-expert time (``ScheduleOptions.expert_assignment``: the
router-skew model's busiest rank and the all-to-all, per LLM token) beside its encoder and LLM work,
against the one weighing LLM work alone, under the preset's uniform router (skew 1) and a skewed one.

Per case (qwen3vl-30b-a3b, a40-paper, 64 GPUs, the DP and ``ep`` given, so the LLM's experts are
sharded): Entrain planned as ``entrain simulate`` plans it, the decision made on the planner's draws
(both candidates' simulated ms and the choice); then the planned layout after the simulated memory
check, run on the case's own batches with each candidate (off, on, on with each EP group binned
together: the same batches, every number).

    python benchmarks/moe_assignment.py [--cases chartqa,text-heavy] [--skews 1,3] [--out FILE.json]

Prints a markdown table (pasted into ``results/workload_zoo.md``'s section on it) and writes the JSON
where ``--out`` says.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from provenance import source  # benchmarks/provenance.py (scripts run from this folder)

from entrain.config import ModelConfig
from entrain.core.planning.extensions import EP_GROUP
from entrain.core.planning.setups import ConfigRequest, system_setups
from entrain.data.sampling import dataset_sampler
from entrain.data.workload_io import load_workload
from entrain.sim.choose import candidate_judge
from entrain.sim.memory_fit import fit_memory_best
from entrain.sim.run import run_system

MODEL, HARDWARE, GPUS, MICROBATCH = "qwen3vl-30b-a3b", "a40-paper", 64, 4
VARIANTS = {
    "off": {"expert_assignment": False, "expert_group_bins": False},
    "on": {"expert_assignment": True, "expert_group_bins": False},
    EP_GROUP: {"expert_assignment": True, "expert_group_bins": True},
}
"""The ``expert_assignment`` decision's candidates as schedule options."""


def with_skew(cost, skew: float):
    """``cost`` with every sparse LLM layer's routing skew (``ExpertCost.skew``) set to ``skew``."""
    layers = tuple(
        replace(x, experts=replace(x.experts, skew=skew)) if x.experts is not None else x
        for x in cost.llm.layers
    )
    return replace(cost, llm=replace(cost.llm, layers=layers))


def run_case(dataset: str, skew: float, dp: int, ep: int, global_batch: int, iterations: int) -> dict:
    cost = with_skew(ModelConfig(name=MODEL, hardware=HARDWARE).cost_model(), skew)
    req = ConfigRequest(dataset, MODEL, GPUS, dp, 1, global_batch, MICROBATCH, 0, ep=ep)
    sampler = dataset_sampler(dataset, 0)
    setup = system_setups(["entrain"], req, cost, sampler, candidate_judge(sampler, cost, req))["entrain"]
    (d,) = [d for d in setup.decisions if d.name == "expert_assignment"]
    batches = list(load_workload(dataset, cost, global_batch=global_batch, iterations=iterations, seed=0))
    fitted, _ = fit_memory_best("entrain", setup, batches, cost, dict(setup.options), margin=req.margin)
    ms = {}
    for name, extra in VARIANTS.items():
        options = {**fitted.options, **extra}
        run = run_system("entrain", fitted.layout, batches, cost, options, trace_iterations=0)
        ms[name] = run.metrics.iteration_time_ms
    llm = fitted.layout.components["llm"]
    return {
        "dataset": dataset, "skew": skew, "dp": dp, "ep": llm.ep, "llm_pp": llm.pp, "global_batch": global_batch,
        "iterations": iterations, "decision": d.to_json(), "run_ms": ms,
        "chosen_vs_off": ms[d.chosen] / ms["off"],
    }  # fmt: skip


def render(cases: list[dict]) -> str:
    names = list(VARIANTS)
    lines = [
        "| workload | router skew | DP / ep / LLM PP | draws: "
        + " / ".join(names)
        + " ms | chosen | run: "
        + " / ".join(names)
        + " ms | chosen / off |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        d = c["decision"]
        draws = " / ".join(f"{d['candidates'][n]:.0f}" for n in names)
        run = " / ".join(f"{c['run_ms'][n]:.0f}" for n in names)
        lines.append(
            f"| {c['dataset']} | {c['skew']:g} | {c['dp']} / {c['ep']} / {c['llm_pp']} | {draws} | {d['chosen']} | "
            f"{run} | {c['chosen_vs_off']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="chartqa,text-heavy")
    p.add_argument("--skews", default="1,3")
    p.add_argument("--dp", type=int, default=8)
    p.add_argument("--ep", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--iterations", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    t0, cases = time.perf_counter(), []
    for dataset in args.cases.split(","):
        for skew in (float(s) for s in args.skews.split(",")):
            print(f"moe_assignment: {dataset} skew {skew:g} ...", file=sys.stderr, flush=True)
            cases.append(run_case(dataset, skew, args.dp, args.ep, args.global_batch, args.iterations))
    res = {"source": source(), "elapsed_s": time.perf_counter() - t0, "cases": cases}
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(render(cases))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
