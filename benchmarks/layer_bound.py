"""The whole-layer bound: what the setup's split of whole layers over pipeline ranks leaves of the ceiling.

``ceiling.py --layers`` runs it over the ceiling's cases and adds its section to ``results/ceiling.md``.

``ceiling.py``'s bound spreads the iteration's work evenly over every GPU. A pipeline cannot: at the setup's
DP ``d`` and TP ``t`` on ``G`` GPUs, a plan whose every pipeline rank is one TP group (CP 1) has
``P = G / (d t)`` ranks per replica, and every replica holds the same layers on the same rank (the split is
static; a layer is not cut). Per iteration, with ``w_l`` = layer ``l``'s forward + backward ms at
(TP ``t``, CP 1) summed over every sample of the batch and divided by ``d`` (per-call constants excluded,
as in ``ceiling.py``): the iteration lasts at least its busiest GPU's busy time, which is at least the
replica-mean busy time of the busiest rank, ``max_r sum(w_l, l on r)``. For any placement of the layers
on ``P`` ranks (contiguous or not) that is at least

* ``sum(w) / P`` (the work term of ``ceiling.py`` at these degrees), and
* for every ``j``: of the ``j P + 1`` heaviest layers some rank holds ``j + 1`` (pigeonhole), so the
  busiest rank holds at least the ``j + 1`` lightest of them.

``packing`` is the largest of these; the case's **layer bound** = max(``ceiling.py``'s bound, packing),
a bound on every system whose plans keep one TP group per rank (``ceiling.py``'s ``_checked``). Where every rank holds one
contiguous run of the encoder-then-LLM layers (``contiguous_layout``: Entrain's disjoint and
boundary-sharing layouts, DistTrain's, 1F1B's; not DIP's, which puts encoder chunk ``r`` and LLM chunk
``r`` on rank ``r``), the busiest rank holds at least ``contiguous``: the bottleneck of the min-max
partition of the concatenated layers into ``P`` runs (``planning.partition``), the best such a split can
reach. Where each rank holds one run of the encoder's layers and one of the LLM's (either may be empty),
each component's runs in rank order (``looped_layout``: DIP's placement, and every contiguous split), it
holds at least ``looped``: the best such placement, by dynamic programming over both components'
boundaries (``looped_ms``, ``looped_split``). So packing <= looped <= contiguous.
"""

from __future__ import annotations

import math

import numpy as np

from entrain.core.costs.costmodel import CostModel
from entrain.core.planning.partition import min_max_partition


# --- the bound ----------------------------------------------------------------------------------------
def layer_work_ms(batch, cost: CostModel, *, tp: int, dp: int) -> list[float]:
    """Per layer (the encoder's, then the LLM's): forward + backward ms at (``tp``, CP 1) over every sample
    of ``batch``, per-call constants excluded, divided by ``dp`` (the replica mean)."""
    out = []
    for comp in ("encoder", "llm"):
        per_sample = [(cost.units(comp, s.meta), cost.labels(comp, s.meta)) for s in batch]
        for i in range(cost.component(comp).num_layers):
            ms = sum(
                cost.layer_ms(comp, i, units, phase, tp, 1, 0, labels)
                for units, labels in per_sample
                if units
                for phase in ("fwd", "bwd")
            )
            out.append(ms / dp)
    return out


def packing_bound_ms(work_ms: list[float], ranks: int) -> float:
    """The least busiest-rank time of any placement of whole layers ``work_ms`` on ``ranks`` ranks can reach
    is at least this: the mean, and for every ``j`` the ``j + 1`` lightest of the ``j * ranks + 1``
    heaviest (some rank holds ``j + 1`` of them)."""
    heavy = sorted(work_ms, reverse=True)
    best = sum(heavy) / ranks
    j = 0
    while j * ranks + 1 <= len(heavy):
        top = heavy[: j * ranks + 1]
        best = max(best, sum(top[-(j + 1) :]))
        j += 1
    return best


def contiguous_ms(work_ms: list[float], ranks: int) -> float:
    """The busiest rank of the best split of the layers into ``ranks`` contiguous runs."""
    return min_max_partition(work_ms, min(ranks, len(work_ms))).bottleneck_ms


def looped_ms(encoder_ms: list[float], llm_ms: list[float], ranks: int) -> float:
    """The busiest rank of the best placement where rank ``r`` holds one contiguous run of the encoder's
    layers and one of the LLM's (either may be empty), each component's runs in rank order: DIP's looped
    placement, and every contiguous split, are such placements (``looped_split``)."""
    return looped_split(encoder_ms, llm_ms, ranks)[0]


def looped_split(
    encoder_ms: list[float], llm_ms: list[float], ranks: int
) -> tuple[float, list[tuple[tuple[int, int], tuple[int, int]]]]:
    """``looped_ms`` and a placement reaching it: per rank, its (first, end) encoder layers and (first, end)
    LLM layers. ``f[i, j]``: the best busiest rank of the ranks so far covering the first ``i`` encoder and
    ``j`` LLM layers; each rank extends both runs (``back``: where the rank's runs start)."""
    pe = np.concatenate([[0.0], np.cumsum(encoder_ms)])
    pl = np.concatenate([[0.0], np.cumsum(llm_ms)])
    f = np.full((len(pe), len(pl)), np.inf)
    f[0, 0] = 0.0
    back = []
    for _ in range(ranks):
        g = np.full_like(f, np.inf)
        start = np.zeros(f.shape + (2,), dtype=int)
        for i in range(len(pe)):
            enc = (pe[i] - pe[: i + 1])[:, None]
            for j in range(len(pl)):
                both = np.maximum(f[: i + 1, : j + 1], enc + (pl[j] - pl[: j + 1])[None, :])
                k = np.unravel_index(np.argmin(both), both.shape)
                g[i, j], start[i, j] = both[k], k
        f = g
        back.append(start)
    i, j = len(pe) - 1, len(pl) - 1
    runs = []
    for start in reversed(back):
        a, b = (int(x) for x in start[i, j])
        runs.append(((a, i), (b, j)))
        i, j = a, b
    return float(f[-1, -1]), runs[::-1]


def iteration_layer_bounds(batch, cost: CostModel, *, gpus: int, dp: int, tp: int) -> dict:
    ranks = gpus // (dp * tp)
    work = layer_work_ms(batch, cost, tp=tp, dp=dp)
    n_enc = cost.component("encoder").num_layers
    return {
        "ranks": ranks,
        "packing_ms": packing_bound_ms(work, ranks),
        "looped_ms": looped_ms(work[:n_enc], work[n_enc:], ranks),
        "contiguous_ms": contiguous_ms(work, ranks),
    }


# --- systems: the premises their plans meet -----------------------------------------------------------
def contiguous_layout(layout, num_encoder_layers: int) -> bool:
    """Whether each pipeline rank of ``layout`` holds one contiguous run of the encoder-then-LLM layers."""
    for r in range(layout.ranks_per_replica):
        spans = sorted(
            (st.first_layer + (num_encoder_layers if st.component == "llm" else 0),
             st.end_layer + (num_encoder_layers if st.component == "llm" else 0))
            for st in layout.stages_of(r)
        )  # fmt: skip
        if any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
            return False
    return True


def looped_layout(layout) -> bool:
    """Whether each rank of ``layout`` holds at most one contiguous run of each component's layers, each
    component's runs in rank order (the placements ``looped_ms`` ranges over)."""
    for comp in layout.components:
        runs = []
        for r in range(layout.ranks_per_replica):
            spans = sorted(
                (st.first_layer, st.end_layer) for st in layout.stages_of(r) if st.component == comp
            )
            if any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
                return False
            runs += [(spans[0][0], spans[-1][1])] if spans else []
        if any(a[1] != b[0] for a, b in zip(runs, runs[1:])):
            return False
    return True


def layout_facts(run, num_encoder_layers: int) -> dict:
    """What ``layer_bound``'s premises ask of a run's plan: each component's (TP, CP), the pipeline ranks per
    replica, whether each rank holds one contiguous run of layers, and its busiest rank's busy time."""
    layout = run.layout
    return {
        "degrees": {c: [p.tp, p.cp] for c, p in layout.components.items()},
        "ranks": layout.ranks_per_replica,
        "contiguous": contiguous_layout(layout, num_encoder_layers),
        "looped": looped_layout(layout),
        "busiest_rank_ms": busiest_rank_ms(run),
    }


def checked(system: dict, tp: int, ranks: int) -> dict:
    """A system's time with the premises its layout meets (None: not recorded, a run from before)."""
    facts = system.get("layout")
    out = {
        "iteration_time_ms": system["iteration_time_ms"],
        "covered": None,
        "contiguous": None,
        "looped": None,
    }
    if facts:
        degrees = facts["degrees"].values()
        out["covered"] = facts["ranks"] == ranks and all(d == [tp, 1] for d in degrees)
        out["contiguous"] = facts["contiguous"]
        # a contiguous split is a looped placement; a run recorded before the looped check says no more
        out["looped"] = facts.get("looped", True if facts["contiguous"] else None)
        out["busiest_rank_ms"] = facts["busiest_rank_ms"]
    return out


def rank_busy_ms(layout, it) -> list[float]:
    """Per pipeline rank: its busy time in iteration ``it`` (a simulated iteration), averaged over replicas."""
    busy = {g: b for rep in it.replicas for g, b in rep.busy_ms.items()}
    return [
        sum(busy[layout.global_rank(d, r)] for d in range(layout.dp)) / layout.dp
        for r in range(layout.ranks_per_replica)
    ]


def busiest_rank_ms(run) -> float:
    """The busy time of a run's busiest pipeline rank, averaged over its replicas, then over iterations."""
    return sum(max(rank_busy_ms(run.layout, it)) for it in run.iterations) / len(run.iterations)


def breaks_bound(system: dict, row: dict, time_key: str, busy_key: str) -> bool:
    """Whether a system breaks the bound: its time below ``row[time_key]`` (unless its layout is known not
    to be covered), or its busiest rank below ``row[busy_key]`` (where its layout is recorded and covered)."""
    if system["covered"] is None:
        return system["iteration_time_ms"] < row[time_key]
    return system["covered"] and (
        system["iteration_time_ms"] < row[time_key] or system["busiest_rank_ms"] < row[busy_key]
    )


BOUNDS = (
    ("below_layer_bound", None, "layer_bound_ms", "packing_ms"),
    ("below_looped", "looped", "looped_ms", "looped_ms"),
    ("below_contiguous", "contiguous", "contiguous_ms", "contiguous_ms"),
)
"""Per figure of a case row: the list of systems below it, the premise a plan must meet for it to hold
(None: covered alone), the time and the busiest-rank figure."""


def systems_below(row: dict) -> dict[str, list[str]]:
    """Per figure (``BOUNDS``), the systems of ``row`` whose plans meet its premise and break it."""
    return {
        name: [
            m
            for m, v in row["systems"].items()
            if (premise is None or v[premise]) and breaks_bound(v, row, t, b)
        ]
        for name, premise, t, b in BOUNDS
    }


# --- ratios ----------------------------------------------------------------------------
def ratios(c: dict) -> dict:
    sy = c["systems"]
    best = sy[c["best_fitting_baseline"]]["iteration_time_ms"] if c.get("best_fitting_baseline") else None
    dist = sy.get("disttrain", {}).get("iteration_time_ms")
    ent = sy["entrain"]["iteration_time_ms"]
    return {
        "ceiling": best / c["bound_ms"] if best else None,
        "layer_ceiling": best / c["layer_bound_ms"] if best else None,
        "disttrain_ceiling": dist / c["bound_ms"] if dist else None,
        "disttrain_layer_ceiling": dist / c["layer_bound_ms"] if dist else None,
        "contiguous_ceiling": best / max(c["bound_ms"], c["contiguous_ms"]) if best else None,
        "disttrain_contiguous_ceiling": dist / max(c["bound_ms"], c["contiguous_ms"]) if dist else None,
        "looped_ceiling": best / max(c["layer_bound_ms"], c["looped_ms"]) if best else None,
        "disttrain_looped_ceiling": dist / max(c["layer_bound_ms"], c["looped_ms"]) if dist else None,
        "achieved": best / ent if best else None,
        "disttrain_achieved": dist / ent if dist else None,
        "entrain_over_layer_bound": ent / c["layer_bound_ms"],
    }


def summary(rows: list[dict]) -> dict:
    """Over ``rows`` (the section's cases): the headline's ratios and the zoo's geometric means."""
    zoo_rows = [ratios(c) for c in rows if "zoo" in c["lists"]]
    head = [c for c in rows if "headline" in c["lists"]]
    out = {
        "zoo_cases": len(zoo_rows),
        "zoo_geomean_ceiling": geomean(r["ceiling"] for r in zoo_rows),
        "zoo_geomean_layer_ceiling": geomean(r["layer_ceiling"] for r in zoo_rows),
        "zoo_geomean_contiguous_ceiling": geomean(r["contiguous_ceiling"] for r in zoo_rows),
        "zoo_geomean_looped_ceiling": geomean(r["looped_ceiling"] for r in zoo_rows),
        "zoo_geomean_achieved": geomean(r["achieved"] for r in zoo_rows),
        "below_layer_bound": [f"{c['case']}: {n}" for c in rows for n in c["below_layer_bound"]],
        "below_contiguous": [f"{c['case']}: {n}" for c in rows for n in c["below_contiguous"]],
        "below_looped": [f"{c['case']}: {n}" for c in rows for n in c["below_looped"]],
    }
    if head:
        out["headline"] = {"case": head[0]["case"], **ratios(head[0])}
    return out


def geomean(xs) -> float | None:
    """The geometric mean of the ``xs`` that are set (None when none is)."""
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


# --- report ------------------------------------------------------------------------------------------------
def _f(x, nd=3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def render_section(sec: dict, target_headline: float, target_geomean: float) -> list[str]:
    """The report's section on the whole-layer bound (``sec``: ``{"cases", "summary", "elapsed_s"}``)."""
    s = sec["summary"]
    lines = [
        "", "## Whole layers on the setup's pipeline ranks", "",
        f"From `python benchmarks/ceiling.py --layers` (wall time {sec['elapsed_s']:.0f} s; `benchmarks/layer_bound.py`'s "
        "docstring gives the derivation). Per case and iteration, on the same batches: **packing** = a lower bound on "
        "the busiest pipeline rank's replica-mean busy time for any placement of whole layers on the setup's ranks "
        "(ranks = GPUs / (DP x TP), CP 1); **layer bound** = max(bound, packing), a bound on every system that keeps "
        "one TP group per rank; **contiguous** = the busiest rank of the best split of the encoder-then-LLM layers "
        "into contiguous runs, a bound on every plan whose ranks each hold one contiguous run (Entrain's disjoint and "
        "boundary-sharing layouts, DistTrain's, 1F1B's; not DIP's interleaved placement); **looped** = the busiest rank "
        "of the best placement where each rank holds one run of encoder layers and one of LLM layers, each component's "
        "runs in rank order (DIP's placement, and every contiguous split). Ceilings divide the best "
        "fitting baseline (or DistTrain) by them. *covered*: per system, whether its plan keeps one TP group per rank "
        "whether each rank holds one contiguous run, and whether its placement is looped (recorded where the case was simulated in this run; else the "
        "systems' times are `ceiling.json`'s above, not checked).", "",
    ]  # fmt: skip
    h = s.get("headline")
    if h:
        lines.append(
            f"- {h['case']}: target {target_headline:.2f}x DistTrain; achieved {_f(h['disttrain_achieved'])}x; ceiling "
            f"{_f(h['disttrain_ceiling'])}x (bound), {_f(h['disttrain_layer_ceiling'])}x (layer bound, any placement), "
            f"{_f(h['disttrain_looped_ceiling'])}x (looped), {_f(h['disttrain_contiguous_ceiling'])}x (contiguous runs)"
        )  # fmt: skip
    lines += [
        f"- zoo ({s['zoo_cases']} cases), geometric mean of best fitting baseline / bound: target {target_geomean:.2f}x; "
        f"achieved {_f(s['zoo_geomean_achieved'])}x; ceiling {_f(s['zoo_geomean_ceiling'])}x (bound), "
        f"{_f(s['zoo_geomean_layer_ceiling'])}x (layer bound), {_f(s['zoo_geomean_looped_ceiling'])}x (looped), "
        f"{_f(s['zoo_geomean_contiguous_ceiling'])}x (contiguous runs)",
        "- covered systems below their case's layer bound, or looped below its looped figure, or with contiguous runs "
        "below its contiguous figure (a broken bound): "
        + (", ".join(s["below_layer_bound"] + s["below_looped"] + s["below_contiguous"]) or "none"),
        "",
        "| case | ranks | bound | packing | layer bound | looped | contiguous | Entrain | DistTrain | best baseline | "
        "ceiling | layer ceiling | looped ceiling | contiguous ceiling | DistTrain: layer / looped / contiguous ceiling | "
        "Entrain / contiguous | covered |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---|",
    ]  # fmt: skip
    for c in sec["cases"]:
        r, sy = ratios(c), c["systems"]
        best = c["best_fitting_baseline"]
        dist = sy.get("disttrain", {}).get("iteration_time_ms")
        ent = sy["entrain"]["iteration_time_ms"]
        lines.append(
            f"| {c['case']} | {c['ranks']} | {c['bound_ms']:.1f} | {c['packing_ms']:.1f} | {c['layer_bound_ms']:.1f} | "
            f"{c['looped_ms']:.1f} | {c['contiguous_ms']:.1f} | {ent:.1f} | {_f(dist, 1)} | {best} {sy[best]['iteration_time_ms']:.1f} | "
            f"{_f(r['ceiling'])} | {_f(r['layer_ceiling'])} | {_f(r['looped_ceiling'])} | {_f(r['contiguous_ceiling'])} | "
            f"{_f(r['disttrain_layer_ceiling'])} / {_f(r['disttrain_looped_ceiling'])} / "
            f"{_f(r['disttrain_contiguous_ceiling'])} | "
            f"{ent / max(c['bound_ms'], c['contiguous_ms']):.3f} | {_covered(sy)} |"
        )  # fmt: skip
    return lines + _probe_lines(sec["cases"])


def _probe_lines(rows: list[dict]) -> list[str]:
    """The looped probe's table (``looped_probe.py``), for the cases simulated in this run."""
    probed = [c for c in rows if c.get("looped_probe")]
    if not probed:
        return []
    names = list(probed[0]["looped_probe"]["schedules"])
    lines = [
        "", "### The looped placement under the schedules we have", "",
        "From `benchmarks/looped_probe.py`, on each case simulated in this run: Entrain's batcher on the best looped "
        "placement of the case's layers (their work averaged over its batches), scheduled by each order the engine "
        "has for a rank holding an encoder stage and an LLM stage, with no recomputation; per order the simulated "
        "iteration time, the busiest rank's busy time, and whether it fits device memory. Entrain's own plan "
        "(contiguous runs) is beside it.", "",
        "| case | looped figure | Entrain | " + " | ".join(names) + " |",
        "|---|---:|---:|" + "---:|" * len(names),
    ]  # fmt: skip
    for c in probed:
        p = c["looped_probe"]
        cells = [
            f"{v['iteration_time_ms']:.1f} (busiest {v['busiest_rank_ms']:.1f}{'' if v['fits_memory'] else ', does not fit'})"
            for v in p["schedules"].values()
        ]
        lines.append(
            f"| {c['case']} | {p['looped_split_ms']:.1f} | {p['entrain_ms']:.1f} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def memory_probe_lines(rows: list[dict]) -> list[str]:
    """``memory_probe.py``'s table, for the cases it probed."""
    probed = [c for c in rows if c.get("memory_probe")]
    if not probed:
        return []
    lines = [
        "", "### Entrain with device memory unlimited", "",
        "From `benchmarks/memory_probe.py`, on each case it probed: Entrain (every decision it takes) on "
        "the case's first iteration, on its preset and again with the device memory raised to "
        "`UNLIMITED_BYTES` (1e15 bytes), side by side on the same samples; the contiguous figure is that "
        "iteration's. Recompute: the modes its stages use.", "",
        "| case | contiguous figure | Entrain | busiest rank | recompute | Entrain, memory unlimited | busiest rank "
        "| recompute | its peak memory (GB) | Entrain / figure | unlimited / figure |",
        "|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|",
    ]  # fmt: skip
    for c in probed:
        p = c["memory_probe"]
        a, b, fig = p["preset"], p["unlimited"], p["contiguous_ms"]
        lines.append(
            f"| {c['case']} | {fig:.1f} | {a['iteration_time_ms']:.1f} | {a['busiest_rank_ms']:.1f} | "
            f"{'/'.join(a['recompute'])} | {b['iteration_time_ms']:.1f} | {b['busiest_rank_ms']:.1f} | "
            f"{'/'.join(b['recompute'])} | {b['peak_memory_bytes'] / 1e9:.1f} | {a['iteration_time_ms'] / fig:.3f} | "
            f"{b['iteration_time_ms'] / fig:.3f} |"
        )  # fmt: skip
    return lines


def _covered(systems: dict) -> str:
    if all(v["covered"] is None for v in systems.values()):
        return "not checked"
    out = [n for n, v in systems.items() if not v["covered"]]
    runs = [n for n, v in systems.items() if v["covered"] and not v["contiguous"]]
    loops = [n for n in runs if systems[n]["looped"] is None]
    unknown = f" (looped not recorded: {', '.join(loops)})" if loops else ""
    return (
        f"{'all but ' + ', '.join(out) if out else 'all'}; interleaved: {', '.join(runs) or 'none'}{unknown}"
    )
