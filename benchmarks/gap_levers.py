"""What each part of Entrain's gap is worth on the zoo's geometric mean (``ceiling.py``'s report).

``ceiling.gap`` splits Entrain's simulated time on a case into the bound's work and four terms: recompute,
overheads, imbalance (busiest GPU's busy - mean busy) and idle (time - busiest GPU's busy). A lever here is
one of those terms taken to zero on every zoo case at once, every other term as it is: the geometric mean
of best fitting baseline / (Entrain's time - the term). "Imbalance beyond the best contiguous split" takes
off only the imbalance above the best contiguous split's own (its figure - the bound, ``layer_bound.py``):
what a plan with contiguous runs, Entrain's kind, could remove. It says how far removing that term alone would
take the zoo, not that a plan doing so exists (the terms are not independent: an even split of layers
moves bubbles too).

The memory lever is measured, not subtracted: ``memory_probe.py`` runs Entrain on a case's first iteration
at its preset and with device memory unlimited, every decision re-taken. A probed case's achieved ratio is
scaled by preset / unlimited time on that iteration; a case not probed keeps its ratio.
"""

from __future__ import annotations

from layer_bound import geomean


def _contiguous_excess_ms(c: dict, row: dict) -> float:
    """Entrain's imbalance beyond what the best contiguous split leaves (its figure - the bound, ``layer_bound``):
    the part of the imbalance a plan with contiguous runs could remove."""
    return max(0.0, c["entrain_gap"]["imbalance_ms"] - max(0.0, row["contiguous_ms"] - c["bound_ms"]))


def _gap(*keys: str):
    return lambda c, row: sum(c["entrain_gap"][k] for k in keys)


TERMS = {
    "idle": _gap("idle_ms"),
    "imbalance": _gap("imbalance_ms"),
    "imbalance beyond the best contiguous split": _contiguous_excess_ms,
    "recompute": _gap("recompute_ms"),
    "idle and imbalance": _gap("idle_ms", "imbalance_ms"),
    "idle and imbalance beyond the best contiguous split": lambda c, row: (
        _gap("idle_ms")(c, row) + _contiguous_excess_ms(c, row)
    ),
}
"""Lever name -> the ms it takes off Entrain's time on a case (its ``ceiling.py`` row, its whole-layer row)."""


def _zoo(res: dict) -> list[dict]:
    return [c for c in res["cases"] if "error" not in c and "zoo" in c["lists"]]


def _best_and_entrain(c: dict) -> tuple[float, float]:
    s = c["systems"]
    return s[c["best_fitting_baseline"]]["iteration_time_ms"], s["entrain"]["iteration_time_ms"]


def memory_factors(res: dict) -> dict[str, float]:
    """Per probed case: Entrain's time at its preset / with device memory unlimited (its first iteration)."""
    rows = res.get("layer_bound", {}).get("cases", [])
    return {
        c["case"]: c["memory_probe"]["preset"]["iteration_time_ms"]
        / c["memory_probe"]["unlimited"]["iteration_time_ms"]
        for c in rows
        if c.get("memory_probe")
    }


def levers(res: dict) -> dict:
    """The zoo's geometric mean of best fitting baseline / Entrain as achieved, with each ``TERMS`` lever,
    and with the memory lever on the probed cases (``memory_probed``: how many zoo cases carry a probe)."""
    zoo = [c for c in _zoo(res) if c.get("best_fitting_baseline")]
    rows = {c["case"]: c for c in res.get("layer_bound", {}).get("cases", [])}
    out = {"zoo_cases": len(zoo), "achieved": geomean(b / e for b, e in map(_best_and_entrain, zoo))}
    for name, cut_ms in TERMS.items():
        if name.endswith("contiguous split") and not all(c["case"] in rows for c in zoo):
            continue  # no whole-layer section for every case: no contiguous figure
        out[name] = geomean(
            b / (e - cut_ms(c, rows.get(c["case"]))) for c in zoo for b, e in [_best_and_entrain(c)]
        )
    factors = memory_factors(res)
    out["memory"] = geomean(
        b / e * factors.get(c["case"], 1.0) for c in zoo for b, e in [_best_and_entrain(c)]
    )
    out["memory_probed"] = sum(c["case"] in factors for c in zoo)
    return out


def render(lv: dict, target: float) -> list[str]:
    """The report's lines on the levers (``lv``: ``levers``' result)."""
    lines = [
        "", "### What each term is worth on the zoo", "",
        f"Geometric mean over the {lv['zoo_cases']} zoo cases of best fitting baseline / Entrain, with one term of "
        "Entrain's gap (\"What the bound holds, and Entrain's gap to it\") taken to zero on every case, the others "
        "as they are; imbalance beyond the best contiguous split: only the imbalance above that split's own "
        "(contiguous figure - bound) (`benchmarks/gap_levers.py`). Memory: the probed cases' achieved ratios "
        "scaled by Entrain's time at the preset / with memory unlimited (\"Entrain with device memory "
        f"unlimited\"; {lv['memory_probed']} of the {lv['zoo_cases']} cases "
        f"probed, the others unchanged). Target {target:.2f}x.", "",
        "| lever | geometric mean | reaches the target |", "|---|---:|---|",
        f"| none (achieved) | {lv['achieved']:.3f} | {'yes' if lv['achieved'] >= target else 'no'} |",
    ]  # fmt: skip
    for name in (*(n for n in TERMS if n in lv), "memory"):
        label = "memory unlimited (the probed cases)" if name == "memory" else f"no {name}"
        lines.append(f"| {label} | {lv[name]:.3f} | {'yes' if lv[name] >= target else 'no'} |")
    return lines
