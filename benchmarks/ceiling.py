"""The ceiling of the speed-up targets: a lower bound on any system's simulated iteration time, per case.

    python benchmarks/ceiling.py                       # the headline and the zoo's 32 cases -> results/ceiling.{md,json}
    python benchmarks/ceiling.py --quick               # the headline and text-heavy/1B, 1 iteration (a smoke run)
    python benchmarks/ceiling.py --case synthchartnet/1B/a40-paper/seed3 --out one     # some cases only
    python benchmarks/ceiling.py --part 1/2 --out part1 & python benchmarks/ceiling.py --part 2/2 --out part2
    python benchmarks/ceiling.py --merge part1.json part2.json                           # the parts in one report
    python benchmarks/ceiling.py --layers results/ceiling.json --out results/ceiling     # + the whole-layer section

Cases, imported, never retyped: ``regression.py``'s headline (``regression.HEADLINE``: synthchartnet, 1B,
a40-paper, seed 3, 5 iterations) and its 20 workload-zoo cases, and ``workload_zoo.py``'s whole-model
family cases (``FAMILY_DATASETS``, the zoo's settings: 64 GPUs, DP 4, TP 2, global batch 512, microbatch
size 4, a40-paper, seed 0, 3 iterations). Every case runs ``entrain simulate``'s path
(``cli.simulate.simulate_systems``) with the case's systems and every zoo system; the best baseline is
``best_fitting_baseline``'s (a plan over device memory never counts).

The bound, per iteration (then averaged over iterations as the iteration time is), on the same GPUs,
samples and cost model:

    bound = max(work / gpus + all-reduce share, longest sample chain)

* ``work``: every sample's encoder (all its images / frames) and LLM forward + backward, the cost model's
  per-sequence-unit curves with per-call constants excluded (``CostModel.sample_work``), times the
  GPUs one call occupies (TP x CP), at the component's cheapest (TP, CP) in GPU-ms: TP = the setup's
  ``--tp`` (every system of these cases runs at it), CP 1 or 2 (the planner widens CP where a stage
  overflows). No recomputation, no split-backward extra, no small-call factor, no per-call constants or
  per-action overhead, no expert imbalance: each only adds time in the simulator, so leaving it out keeps
  the bound below every plan.
* ``all-reduce share``: the simulator ends an iteration with each pipeline rank's gradient all-reduce
  after its last action, so the iteration time is at least the GPU-weighted mean of (busy + all-reduce);
  the share is the bandwidth term of all trainable gradient bytes at the cheapest TP sharding,
  ``dp * 2 (dp-1)/dp * bytes / bandwidth / gpus``, plus one latency per replica over the GPUs.
* ``longest sample chain``: a sample's largest image forward + backward then its LLM forward + backward
  cannot overlap (the LLM waits for every feature; the encoder's backward for the LLM's), at the fastest
  degree, over the longest samples.

Excluded: pipeline bubbles (fill and drain), message transfer time, load imbalance between ranks and
replicas, and the memory limit (the bound's schedule holds any amount of activations). Recomputation is
excluded too, and the report says per case whether memory forces any: it does when one sample's
activations of one layer, at the widest degree, plus that layer's model state overflow a GPU (then every
plan recomputes). ``bound_any_ms`` relaxes the setup: any (TP, CP) the cost model prices, no all-reduce
(one replica needs none): the bound on any system on these GPUs.

Entrain's gap to the bound, from its simulated run (ms, GPU-weighted means): ``recompute`` (its
backward's re-run forward, priced as the simulator prices it), ``overheads`` (per-call constants,
small calls, split backward, a dearer degree than the bound's), ``imbalance`` (busiest GPU's busy - mean
busy), ``idle`` (iteration time - busiest GPU's busy: pipeline bubbles, message waits and the all-reduce
beyond its share); bound + the four = Entrain's time, up to the chain term.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import gap_levers
import layer_bound
import looped_probe
import regression
import workload_zoo as zoo
from layer_bound import geomean
from provenance import source, stamped

from entrain.cli.common import resolve_cost_model, workload_source
from entrain.cli.main import build_parser
from entrain.cli.simulate import best_fitting_baseline, simulate_systems
from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.sampler import has_costs
from entrain.core.errors import ConfigError
from entrain.core.ir.graph import ReplicaGraph
from entrain.core.schedules.action_costs import PlanCosts

OUT = Path(__file__).parent / "results" / "ceiling"
ALL_TP = (1, 2, 4, 8)
ALL_CP = (1, 2)
CHAIN_CANDIDATES = 8
"""Samples per iteration whose chain is priced (the longest by LLM tokens and by largest image): the max
over any subset of samples is still a lower bound."""
TARGET_HEADLINE = 1.35
TARGET_GEOMEAN = 1.25
FAMILY_HARDWARE, FAMILY_SEED, FAMILY_ITERATIONS = "a40-paper", 0, 3
"""The zoo's family cases run ``simulate`` without ``--hardware``/``--seed`` (defaults a40-paper, 0) and
``--iterations 3``."""


# --- the cases --------------------------------------------------------------------------------------
def all_cases() -> dict[str, dict]:
    """Case key -> ``{"argv", "systems", "lists"}``: the regression's headline and zoo cases (its own
    keys), then the zoo's family cases (``workload_zoo.FAMILY_DATASETS``) keyed alike."""
    out = {}
    for key, case in regression.cases().items():
        if "headline" in case["lists"] or "zoo" in case["lists"]:
            systems = list(case["systems"]) + [s for s in zoo.SYSTEMS if s not in case["systems"]]
            lists = [x for x in case["lists"] if x in ("headline", "zoo")]
            out[key] = {"argv": case["argv"], "systems": systems, "lists": lists}
    for model, datasets in zoo.FAMILY_DATASETS.items():
        if model in getattr(zoo, "SEARCHED_DEGREES", ()):
            continue  # each system searches its own DP, TP and ep there: the setup's TP bound does not hold
        for d in datasets:
            key = f"{d}/{zoo.MODELS[model]}/{FAMILY_HARDWARE}/seed{FAMILY_SEED}"
            argv = regression.argv(d, model, FAMILY_HARDWARE, FAMILY_SEED, FAMILY_ITERATIONS)
            out[key] = {"argv": argv, "systems": list(zoo.SYSTEMS), "lists": ["zoo"]}
    headline = [k for k, c in out.items() if "headline" in c["lists"]]
    return {k: out[k] for k in headline + [k for k in out if k not in headline]}


# --- the bound ----------------------------------------------------------------------------------------
def degrees(cost: CostModel, comp: str, tps, cps) -> list[tuple[int, int]]:
    """The (TP, CP) pairs of ``tps`` x ``cps`` the cost model prices ``comp`` at."""
    got = [(t, c) for t in tps for c in cps if has_costs(cost, comp, t, c)]
    if not got:
        raise ConfigError(f"the cost model prices {comp} at none of TP {tps} x CP {cps}")
    return got


def _component_ms(cost: CostModel, comp: str, units, labels, tp: int, cp: int) -> float:
    n = cost.component(comp).num_layers
    return sum(
        cost.stage_ms(comp, 0, n, units, p, tp, cp, num_calls=0, labels=labels) for p in ("fwd", "bwd")
    )


def allreduce_share_ms(cost: CostModel, gpus: int, dp: int, tps) -> float:
    """The GPU-mean of the gradient all-reduce every plan on ``dp`` replicas pays after its last action:
    the bandwidth term of every trainable layer's gradient bytes at its cheapest TP sharding (summed
    over the ``tp`` GPUs holding a shard), and one latency per replica (some GPU holds gradients)."""
    if dp <= 1:
        return 0.0
    hw = cost.hardware
    total = 0.0
    for comp in ("encoder", "llm"):
        for layer in cost.component(comp).layers:
            if layer.trainable:
                total += min(t * layer.rank_param_bytes(t) for t in tps)
    k = 2.0 * (dp - 1) / dp
    return dp * (k * total / hw.allreduce_bandwidth_bytes_per_ms + hw.allreduce_latency_ms) / gpus


def iteration_bound(batch, cost: CostModel, *, gpus: int, dp: int, tps, cps) -> dict:
    """One iteration's bound (module docstring) over ``batch`` (``SampleWork`` with metadata): the work
    term per component at its cheapest (TP, CP), the all-reduce share, the chain term, their bound."""
    metas = [s.meta for s in batch]
    if any(m is None for m in metas):
        raise ConfigError("ceiling: a sample without token metadata (raw work) has no per-degree price")
    work, chosen = {}, {}
    for comp in ("encoder", "llm"):
        best = None
        for tp, cp in degrees(cost, comp, tps, cps):
            w = tp * cp * sum(_component_ms(cost, comp, cost.units(comp, m), cost.labels(comp, m), tp, cp)
                              for m in metas)  # fmt: skip
            if best is None or w < best:
                best, chosen[comp] = w, (tp, cp)
        work[comp] = best
    compute = (work["encoder"] + work["llm"]) / gpus
    ar = allreduce_share_ms(cost, gpus, dp, tps)
    chain = _chain_ms(metas, cost, tps, cps)
    return {"compute_ms": compute, "allreduce_share_ms": ar, "chain_ms": chain,
            "bound_ms": max(compute + ar, chain), "degrees": {c: list(d) for c, d in chosen.items()}}  # fmt: skip


def _chain_ms(metas, cost: CostModel, tps, cps) -> float:
    by_llm = sorted(metas, key=lambda m: -m.llm_tokens)[:CHAIN_CANDIDATES]
    by_unit = sorted(metas, key=lambda m: -max(m.encoder_units, default=0))[:CHAIN_CANDIDATES]
    best = 0.0
    for m in {m.id: m for m in by_llm + by_unit}.values():
        llm = min(_component_ms(cost, "llm", cost.units("llm", m), cost.labels("llm", m), t, c)
                  for t, c in degrees(cost, "llm", tps, cps))  # fmt: skip
        units = cost.units("encoder", m)
        enc = 0.0
        if units:
            enc = min(_component_ms(cost, "encoder", (max(units),), None, t, c)
                      for t, c in degrees(cost, "encoder", tps, cps))  # fmt: skip
        best = max(best, enc + llm)
    return best


def recompute_forced(batches, cost: CostModel, tps, cps) -> bool:
    """Whether memory forces recomputation on every plan: some layer's activations for the one sample
    with the most sequence tokens, plus the layer's model state, overflow a GPU at the widest degree."""
    limit = cost.hardware.device_memory_bytes
    for comp in ("encoder", "llm"):
        tp, cp = max(degrees(cost, comp, tps, cps), key=lambda d: d[0] * d[1])
        seqs = [cost.units(comp, s.meta) for b in batches for s in b]
        tokens = max((sum(u) for u in seqs), default=0)
        sq = max((sum(x * x for x in u) for u in seqs), default=0)
        for layer in cost.component(comp).layers:
            act = (layer.activation_bytes_per_token * tokens + layer.activation_bytes_per_token_sq * sq) / (
                tp * cp
            )
            state = layer.rank_param_bytes(tp) * (18.0 if layer.trainable else 1.0)
            if act + state > limit:
                return True
    return False


def case_bounds(batches, cost: CostModel, args: argparse.Namespace) -> dict:
    """The setup's bound (``--tp``, CP 1 or 2, ``--dp``'s all-reduce) and the any-degree one, averaged
    over the iterations."""
    cp = getattr(args, "cp", 1)  # simulate has no --cp: 1, widened to 2 where a stage overflows
    cps = ALL_CP if cp in (0, 1) else (cp,)
    setup = [
        iteration_bound(b, cost, gpus=args.gpus, dp=args.dp or 1, tps=(args.tp,), cps=cps) for b in batches
    ]
    loose = [iteration_bound(b, cost, gpus=args.gpus, dp=1, tps=ALL_TP, cps=ALL_CP) for b in batches]

    def mean(rows, k):
        return sum(r[k] for r in rows) / len(rows)

    return {
        "bound_ms": mean(setup, "bound_ms"),
        "compute_ms": mean(setup, "compute_ms"),
        "allreduce_share_ms": mean(setup, "allreduce_share_ms"),
        "chain_ms": mean(setup, "chain_ms"),
        "degrees": setup[0]["degrees"],
        "bound_any_ms": mean(loose, "bound_ms"),
        "degrees_any": loose[0]["degrees"],
        "recompute_forced": recompute_forced(batches, cost, (args.tp,), cps),
    }


# --- Entrain's gap ---------------------------------------------------------------------------------------
def _gpus_per_rank(layout) -> list[int]:
    out = []
    for r in range(layout.ranks_per_replica):
        pars = [layout.components[s.component] for s in layout.stages_of(r)]
        out.append(max(p.tp * p.cp for p in pars))
    return out


def _busy_by_rank(plan, costs: PlanCosts) -> list[dict[int, float]]:
    """Per iteration, per global rank: the compute ms of its actions as ``costs`` prices them."""
    layout, out = plan.layout, []
    for it in plan.iterations:
        busy = {}
        for replica in range(layout.dp):
            graph = ReplicaGraph(layout, it.microbatches[replica])
            for r in range(layout.ranks_per_replica):
                g = layout.global_rank(replica, r)
                busy[g] = sum(costs.compute_ms(a.stage, a.kind, graph.ids(a.stage, a.mb, a.sub_index))
                              for a in it.actions[g] if a.kind.is_compute)  # fmt: skip
        out.append(busy)
    return out


def gap(run, cost: CostModel, gpus: int, bounds: dict) -> dict:
    """Entrain's time against the bound, split into recompute, overheads, imbalance and idle (ms)."""
    layout = run.layout
    per_rank = _gpus_per_rank(layout)
    weight = {
        layout.global_rank(d, r): per_rank[r]
        for d in range(layout.dp)
        for r in range(layout.ranks_per_replica)
    }
    bare = replace(layout, stages=tuple(replace(st, recompute="none") for st in layout.stages))
    plain = _busy_by_rank(run.plan, PlanCosts(bare, cost, run.plan.samples))
    rows, p = [], layout.ranks_per_replica
    rank_busy = [0.0] * p
    for it, no_rc in zip(run.iterations, plain):
        busy = {g: b for rep in it.replicas for g, b in rep.busy_ms.items()}
        mean_busy = sum(weight[g] * b for g, b in busy.items()) / gpus
        recompute = sum(weight[g] * (busy[g] - no_rc[g]) for g in busy) / gpus
        by_rank = layer_bound.rank_busy_ms(layout, it)
        rank_busy = [a + b / len(plain) for a, b in zip(rank_busy, by_rank)]
        rows.append({"time": it.iteration_time_ms, "mean_busy": mean_busy, "recompute": recompute,
                     "max_busy": max(busy.values()), "max_rank": max(by_rank)})  # fmt: skip
    m = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    return {
        "recompute_ms": m["recompute"],
        "overheads_ms": m["mean_busy"] - m["recompute"] - bounds["compute_ms"],
        "imbalance_ms": m["max_busy"] - m["mean_busy"],
        "imbalance_ranks_ms": m["max_rank"] - m["mean_busy"],
        "imbalance_replicas_ms": m["max_busy"] - m["max_rank"],
        "idle_ms": m["time"] - m["max_busy"],
        "mean_busy_ms": m["mean_busy"],
        "rank_busy_ms": rank_busy,
        "rank_components": [
            "+".join(dict.fromkeys(st.component for st in layout.stages_of(r))) for r in range(p)
        ],
        "bubble_ratio": run.metrics.bubble_ratio,
        "recompute": sorted({st.recompute for st in layout.stages}),
        "gpus_used": sum(per_rank) * layout.dp,
    }


# --- one case ----------------------------------------------------------------------------------------------
def run_case(key: str, case: dict) -> dict:
    args = build_parser().parse_args(case["argv"])
    t0 = time.perf_counter()
    out = {"case": key, "lists": case["lists"], "argv": case["argv"]}
    try:
        runs, _ = simulate_systems(args, list(case["systems"]))
    except ConfigError as err:
        return {**out, "error": str(err), "wall_s": time.perf_counter() - t0}
    cost = resolve_cost_model(args)
    batches = list(workload_source(args, cost).batches(args.global_batch, args.iterations))
    if {s.id for b in batches for s in b} != set(runs["entrain"].plan.samples):
        raise SystemExit(f"ceiling: {key}: the batches drawn are not the ones the systems ran")
    bounds = case_bounds(batches, cost, args)
    best, _ = best_fitting_baseline(runs)
    systems = system_rows(runs, cost)
    below = [n for n, v in systems.items() if v["iteration_time_ms"] < bounds["bound_ms"]]
    return {
        **out, **bounds, "systems": systems, "best_fitting_baseline": best,
        "below_bound": below, "entrain_gap": gap(runs["entrain"], cost, args.gpus, bounds),
        "wall_s": time.perf_counter() - t0,
    }  # fmt: skip


def system_rows(runs: dict, cost: CostModel) -> dict:
    """Per system: its time, whether it fits, and its plan's layout facts (``layer_bound.layout_facts``)."""
    n_enc = cost.component("encoder").num_layers
    return {n: {"iteration_time_ms": r.metrics.iteration_time_ms, "fits_memory": r.metrics.fits_memory,
                "layout": layer_bound.layout_facts(r, n_enc)} for n, r in runs.items()}  # fmt: skip


def layers_case(key: str, case: dict, stored: dict | None, simulate: bool) -> dict:
    """``layer_bound``'s figures for one case (means over its iterations), with its systems' times simulated
    now (``simulate``: each system's layout checked against the bound's premises) or from ``stored`` (a
    ``run_case`` row)."""
    args = build_parser().parse_args(case["argv"])
    cost, dp = resolve_cost_model(args), args.dp or 1
    batches = list(workload_source(args, cost).batches(args.global_batch, args.iterations))
    per_it = [layer_bound.iteration_layer_bounds(b, cost, gpus=args.gpus, dp=dp, tp=args.tp) for b in batches]
    setup = [iteration_bound(b, cost, gpus=args.gpus, dp=dp, tps=(args.tp,), cps=ALL_CP) for b in batches]
    n = len(per_it)
    row = {"case": key, "lists": case["lists"], "ranks": per_it[0]["ranks"],
           "bound_ms": sum(x["bound_ms"] for x in setup) / n,
           "packing_ms": sum(r["packing_ms"] for r in per_it) / n,
           "contiguous_ms": sum(r["contiguous_ms"] for r in per_it) / n,
           "looped_ms": sum(r["looped_ms"] for r in per_it) / n,
           "layer_bound_ms": sum(max(x["bound_ms"], r["packing_ms"]) for x, r in zip(setup, per_it)) / n}  # fmt: skip
    if simulate:
        runs, _ = simulate_systems(args, list(case["systems"]))
        systems = system_rows(runs, cost)
        row["best_fitting_baseline"] = best_fitting_baseline(runs)[0]
        row["looped_probe"] = looped_probe.probe(runs["entrain"], batches, cost)
    else:
        systems, row["best_fitting_baseline"] = stored["systems"], stored["best_fitting_baseline"]
    row["systems"] = {name: layer_bound.checked(v, args.tp, row["ranks"]) for name, v in systems.items()}
    row.update(layer_bound.systems_below(row))
    return row


def run_layers(res: dict, selected: dict, simulate: list[str]) -> dict:
    """``res`` (a ceiling run) with its ``layer_bound`` section over ``selected`` cases: the cases in
    ``simulate`` simulated now, the others on ``res``'s times."""
    stored = {c["case"]: c for c in res["cases"] if "error" not in c}
    t0, rows = time.perf_counter(), []
    for key, case in selected.items():
        if key in stored or key in simulate:
            print(f"ceiling: layers {key} ...", file=sys.stderr, flush=True)
            rows.append(layers_case(key, case, stored.get(key), key in simulate))
    sec = {"cases": rows, "summary": layer_bound.summary(rows), "elapsed_s": time.perf_counter() - t0}
    return {**res, "layer_bound": sec, "sources": [*res["sources"], source()]}


def attach_memory(res: dict, probes: list[dict]) -> dict:
    """``res`` (a ceiling run with its whole-layer section) with each of ``probes``' (``memory_probe.py``'s
    files) cases recorded on its row, and their sources."""
    rows = {c["case"]: c for c in res["layer_bound"]["cases"]}
    for run in probes:
        for key, got in run["cases"].items():
            if key not in rows:
                raise SystemExit(f"memory probe: {key} has no row in the whole-layer section")
            rows[key]["memory_probe"] = got
    return {**res, "sources": [*res["sources"], *(run["source"] for run in probes)]}


def ratios(c: dict) -> dict:
    """Entrain, DistTrain and the best baseline's times, the ceiling and achieved ratios of a case row."""
    s = c["systems"]
    me = s["entrain"]["iteration_time_ms"]
    best = c["best_fitting_baseline"]
    b = s[best]["iteration_time_ms"] if best else None
    d = s.get("disttrain", {}).get("iteration_time_ms")
    return {
        "entrain_ms": me, "disttrain_ms": d, "best_ms": b,
        "ceiling": b / c["bound_ms"] if b else None, "achieved": b / me if b else None,
        "ceiling_any": b / c["bound_any_ms"] if b else None,
        "disttrain_ceiling": d / c["bound_ms"] if d else None, "disttrain_achieved": d / me if d else None,
        "entrain_over_bound": me / c["bound_ms"],
    }  # fmt: skip


def summary(res: dict) -> dict:
    ok = [c for c in res["cases"] if "error" not in c]
    zoo_rows = [ratios(c) for c in ok if "zoo" in c["lists"]]
    head = [c for c in ok if "headline" in c["lists"]]
    out = {
        "zoo_cases": len(zoo_rows),
        "zoo_geomean_ceiling": geomean(r["ceiling"] for r in zoo_rows),
        "zoo_geomean_ceiling_any": geomean(r["ceiling_any"] for r in zoo_rows),
        "zoo_geomean_achieved": geomean(r["achieved"] for r in zoo_rows),
        "zoo_geomean_entrain_over_bound": geomean(r["entrain_over_bound"] for r in zoo_rows),
        "below_bound": [f"{c['case']}: {n}" for c in ok for n in c["below_bound"]],
        "zoo_not_run": [
            k for k, c in all_cases().items() if "zoo" in c["lists"] and k not in {c["case"] for c in ok}
        ],
    }
    if head:
        r = ratios(head[0])
        out["headline"] = {"case": head[0]["case"], **r}
    out["levers"] = gap_levers.levers(res)
    return out


# --- report ------------------------------------------------------------------------------------------------
def _f(x, nd=2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def render(res: dict) -> str:
    s = res["summary"]
    lines = [
        "# Ceiling: a lower bound on any system's iteration time, and the speed-up it leaves (simulation)", "",
        f"Generated by `python benchmarks/ceiling.py` (wall time {res['elapsed_s']:.0f} s, summed over its processes, on a shared 2-core "
        "machine). Per case, on the same GPUs, samples and cost model: **bound** = max(every sample's encoder + "
        "LLM forward + backward at the cheapest (TP, CP) the setup allows, in GPU-ms, / GPUs + the gradient "
        "all-reduce's share; the longest sample's own chain) — no bubbles, no imbalance, no transfers, no "
        "recomputation, no per-call constants, no memory limit (`benchmarks/ceiling.py`'s docstring says "
        "exactly what it holds). **ceiling** = best fitting baseline / bound: no system on this setup can beat "
        "the best baseline by more. achieved = best baseline / Entrain. *any* = the bound at any (TP, CP) the "
        "cost model prices and no all-reduce. Times in ms, mean over the case's iterations.", "",
        "## Targets", "",
    ]  # fmt: skip
    h = s.get("headline")
    if h:
        lines.append(
            f"- {h['case']}: target {TARGET_HEADLINE:.2f}x DistTrain; achieved {_f(h['disttrain_achieved'], 3)}x, "
            f"ceiling {_f(h['disttrain_ceiling'], 3)}x (DistTrain / bound); Entrain is {_f(h['entrain_over_bound'], 3)}x "
            f"the bound; reaching {TARGET_HEADLINE:.2f}x needs Entrain at "
            f"{h['disttrain_ms'] / TARGET_HEADLINE:.1f} ms = {h['disttrain_ms'] / TARGET_HEADLINE / (h['entrain_ms'] / h['entrain_over_bound']):.3f}x the bound"
        )  # fmt: skip
    lines += [
        f"- zoo ({s['zoo_cases']} cases), geometric mean of best fitting baseline / Entrain: target "
        f"{TARGET_GEOMEAN:.2f}x; achieved {_f(s['zoo_geomean_achieved'], 3)}x, ceiling {_f(s['zoo_geomean_ceiling'], 3)}x "
        f"(any degree: {_f(s['zoo_geomean_ceiling_any'], 3)}x); Entrain / bound {_f(s['zoo_geomean_entrain_over_bound'], 3)}x "
        "(geometric mean)",
        "- systems below their case's bound (a broken bound): " + (", ".join(s["below_bound"]) or "none"),
        "- zoo cases not in this run: " + (", ".join(s["zoo_not_run"]) or "none"),
        "", "## Every case", "",
        "| case | bound | any | Entrain | DistTrain | best baseline | ceiling | achieved | DistTrain ceiling | "
        "DistTrain achieved | Entrain / bound |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for c in res["cases"]:
        if "error" in c:
            lines.append(f"| {c['case']} | error: {c['error']} |" + " - |" * 9)
            continue
        r = ratios(c)
        best = c["best_fitting_baseline"]
        lines.append(
            f"| {c['case']} | {c['bound_ms']:.1f} | {c['bound_any_ms']:.1f} | {r['entrain_ms']:.1f} | "
            f"{_f(r['disttrain_ms'], 1)} | {best} {_f(r['best_ms'], 1)} | {_f(r['ceiling'], 3)} | "
            f"{_f(r['achieved'], 3)} | {_f(r['disttrain_ceiling'], 3)} | {_f(r['disttrain_achieved'], 3)} | "
            f"{r['entrain_over_bound']:.3f} |"
        )
    lines += [
        "", f"Geometric means over the {s['zoo_cases']} zoo cases: ceiling {_f(s['zoo_geomean_ceiling'], 3)}, "
        f"achieved {_f(s['zoo_geomean_achieved'], 3)}, Entrain / bound {_f(s['zoo_geomean_entrain_over_bound'], 3)}.",
        "", "## What the bound holds, and Entrain's gap to it", "",
        "compute = the work term (GPU-ms / GPUs) at the degrees shown (encoder, LLM: TP x CP); AR = the "
        "all-reduce share; chain = the longest sample's chain (the bound is the larger of compute + AR and "
        "chain). Entrain's time = compute + recompute + overheads + imbalance + idle: recompute = its "
        "backward's re-run forward; overheads = per-call constants, small calls, split backward; imbalance = "
        "busiest GPU's busy - mean busy (ranks: the pipeline rank busiest on average over replicas - the mean, "
        "the split of work over ranks; replicas: the rest, one replica's rank busier than the average); idle = "
        "time - busiest GPU's busy (bubbles, message waits, all-reduce). Forced = memory forces recomputation on every plan (one sample's activations of one "
        "layer at the widest degree overflow a GPU); no: the bound needs none.", "",
        "| case | compute | AR | chain | degrees | recompute | overheads | imbalance (ranks + replicas) | idle | "
        "busiest pipeline rank | bubble ratio | Entrain recomputes | forced |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---|---|",
    ]  # fmt: skip
    for c in res["cases"]:
        if "error" in c:
            continue
        g = c["entrain_gap"]
        deg = ", ".join(f"{t}x{p}" for t, p in c["degrees"].values())
        lines.append(
            f"| {c['case']} | {c['compute_ms']:.1f} | {c['allreduce_share_ms']:.1f} | {c['chain_ms']:.1f} | {deg} | "
            f"{g['recompute_ms']:.1f} | {g['overheads_ms']:.1f} | {g['imbalance_ms']:.1f} "
            f"({g['imbalance_ranks_ms']:.1f} + {g['imbalance_replicas_ms']:.1f}) | {g['idle_ms']:.1f} | {_busiest(g)} | "
            f"{g['bubble_ratio']:.3f} | {'/'.join(g['recompute'])} | {'yes' if c['recompute_forced'] else 'no'} |"
        )
    if "layer_bound" in res:
        lines += layer_bound.render_section(res["layer_bound"], TARGET_HEADLINE, TARGET_GEOMEAN)
        lines += layer_bound.memory_probe_lines(res["layer_bound"]["cases"])
    lines += gap_levers.render(s["levers"], TARGET_GEOMEAN)
    return "\n".join(lines) + "\n"


def _busiest(g: dict) -> str:
    """The pipeline rank busiest on average over replicas: its index, what it holds, its busy against the
    least busy rank's."""
    busy = g["rank_busy_ms"]
    r = max(range(len(busy)), key=busy.__getitem__)
    return f"{r} of {len(busy)} ({g['rank_components'][r]}): {busy[r]:.0f} vs {min(busy):.0f} least"


def write(res: dict, out: Path) -> None:
    res["summary"] = summary(res)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    out.with_suffix(".md").write_text(stamped(render(res), *res["sources"]))
    print(f"ceiling: wrote {out.with_suffix('.md')} and .json", file=sys.stderr)


def _select(args, every: dict) -> dict:
    if args.quick:
        keys = [k for k, c in every.items() if "headline" in c["lists"]] + ["text-heavy/1B/a40-paper/seed0"]
        return {k: {**every[k], "argv": _one_iteration(every[k]["argv"])} for k in keys}
    if args.case:
        unknown = [k for k in args.case if k not in every]
        if unknown:
            raise SystemExit(f"ceiling: unknown case(s) {', '.join(unknown)}; choose from {', '.join(every)}")
        every = {k: every[k] for k in args.case}
    if args.part:
        i, n = map(int, args.part.split("/"))
        every = {k: c for j, (k, c) in enumerate(every.items()) if j % n == i - 1}
    return every


def _one_iteration(argv: list[str]) -> list[str]:
    out = list(argv)
    out[out.index("--iterations") + 1] = "1"
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the headline and text-heavy/1B at 1 iteration")
    p.add_argument("--case", action="append", default=None, help="only this case key (repeatable)")
    p.add_argument(
        "--part", default=None, metavar="I/N", help="every N-th case from the I-th (parallel runs)"
    )
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON", help="render these runs together")
    p.add_argument("--layers", default=None, metavar="JSON",
                   help="add the whole-layer section (layer_bound.py) to this ceiling run's JSON, on its times")  # fmt: skip
    p.add_argument("--simulate", action="append", default=[], metavar="KEY",
                   help="with --layers: simulate this case's systems now, checking each plan's layout (repeatable)")  # fmt: skip
    p.add_argument("--memory-from", nargs="+", default=None, metavar="JSON",
                   help="with --layers: attach these memory_probe.py runs to the section's rows, nothing re-run")  # fmt: skip
    args = p.parse_args(argv)
    if args.layers:
        res = json.loads(Path(args.layers).read_text())
        if args.memory_from:
            probes = [json.loads(Path(f).read_text()) for f in args.memory_from]
            write(attach_memory(res, probes), Path(args.out))
            return 0
        write(run_layers(res, _select(args, all_cases()), args.simulate), Path(args.out))
        return 0
    if args.merge:
        parts = [json.loads(Path(f).read_text()) for f in args.merge]
        order = list(all_cases())
        rows = {c["case"]: c for part in parts for c in part["cases"]}
        sources = {json.dumps(s, sort_keys=True): s for x in parts for s in x["sources"]}
        res = {"elapsed_s": sum(x["elapsed_s"] for x in parts), "sources": list(sources.values()),
               "cases": sorted(rows.values(), key=lambda c: order.index(c["case"]) if c["case"] in order else len(order))}  # fmt: skip
        write(res, Path(args.out))
        return 0
    selected = _select(args, all_cases())
    t0 = time.perf_counter()
    res = {"sources": [source()], "cases": []}
    for i, (key, case) in enumerate(selected.items(), start=1):
        print(f"ceiling: [{i}/{len(selected)}] {key} ...", file=sys.stderr, flush=True)
        res["cases"].append(run_case(key, case))
        res["elapsed_s"] = time.perf_counter() - t0
        write(res, Path(args.out))  # after every case: a long run keeps what it finished
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
