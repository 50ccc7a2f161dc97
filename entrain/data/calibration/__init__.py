"""Calibration targets of the built-in generators (``bounds.json``) and the statistics that check them.

``bounds.json`` lists, per dataset, a statistic, its accepted ``[min, max]``, the source of the
target, optionally the ``setup`` (``model``, ``hardware``, ``attention``) its work statistics are
priced with (default: the file's ``draw``), and ``status``: ``holds`` (tested) or ``deviates`` (the paper's number cannot hold under the
cost model; ``measured`` and ``note`` say what we get and why). ``relations`` are scale-free
comparisons between datasets (e.g. Fig. 4's ordering of per-sample ratios), also tested.

``python -m entrain.data.calibration [--update]`` prints every bound with the value measured now
(``--update`` stores those values as ``measured``, e.g. after a cost-preset refit).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np

from entrain.core.costs.costmodel import CostModel
from entrain.data.generators import generate_samples
from entrain.data.workload_io import sample_works

__all__ = ["BOUNDS_PATH", "load_bounds", "disttrain_microbatch_work", "disttrain_variability", "measure"]

BOUNDS_PATH = Path(__file__).with_name("bounds.json")
_PERCENTILES = (1, 5, 25, 50, 75, 95, 99)


def load_bounds() -> dict:
    with open(BOUNDS_PATH, encoding="utf-8") as f:
        return json.load(f)


def disttrain_microbatch_work(encoder_ms: np.ndarray, dp: int = 4, microbatch_size: int = 4) -> np.ndarray:
    """DistTrain-like per-replica microbatch encoder work, shape ``(num_global_microbatches, dp)``.

    Global microbatch ``m`` = samples ``[m*dp*U, (m+1)*dp*U)`` in data order; its samples go to the
    replicas by LPT on encoder work (heaviest first, to the least-loaded replica that has fewer than
    ``U`` samples, ties to the lowest replica), exactly ``U`` each (docs/design.md §2).
    """
    per_global = dp * microbatch_size
    groups = np.asarray(encoder_ms, dtype=float)[: len(encoder_ms) // per_global * per_global].reshape(
        -1, per_global
    )
    out = np.zeros((groups.shape[0], dp))
    for m, group in enumerate(groups):
        counts = np.zeros(dp, dtype=int)
        for i in np.argsort(-group, kind="stable"):
            open_replicas = np.flatnonzero(counts < microbatch_size)
            r = open_replicas[np.argmin(out[m, open_replicas])]
            out[m, r] += group[i]
            counts[r] += 1
    return out


def disttrain_variability(
    encoder_ms: np.ndarray, global_batch: int = 512, dp: int = 4, microbatch_size: int = 4
) -> dict[str, float]:
    """Per iteration (``global_batch`` consecutive samples), the std / min / max over mean of the
    DistTrain-like per-replica microbatch encoder work (population std, as paper Table 3 / Fig. 15),
    averaged over iterations; ``std_ms`` is the std itself (units of ``encoder_ms``)."""
    iterations = len(encoder_ms) // global_batch
    rows = []
    for it in range(iterations):
        w = disttrain_microbatch_work(
            encoder_ms[it * global_batch : (it + 1) * global_batch], dp, microbatch_size
        )
        mean = w.mean()
        rows.append((w.std() / mean, w.min() / mean, w.max() / mean, w.std()))
    cv, lo, hi, std = np.mean(rows, axis=0)
    return {
        "std_over_mean": float(cv),
        "min_over_mean": float(lo),
        "max_over_mean": float(hi),
        "std_ms": float(std),
    }


def _percentile_stats(prefix: str, x: np.ndarray) -> dict[str, float]:
    stats = {f"{prefix}.p{p}": float(v) for p, v in zip(_PERCENTILES, np.percentile(x, _PERCENTILES))}
    stats[f"{prefix}.mean"] = float(x.mean())
    stats[f"{prefix}.max"] = float(x.max())
    stats[f"{prefix}.min"] = float(x.min())
    return stats


def measure(dataset: str, num_samples: int, seed: int, cost: CostModel | None) -> dict[str, float]:
    """Every statistic ``bounds.json`` can name, for a draw of ``num_samples`` from ``seed``.

    Ratio and DistTrain statistics need ``cost`` (per-sample forward+backward ms); token ones do not.
    """
    samples = generate_samples(dataset, num_samples, seed)
    text = np.array([s.text_tokens for s in samples], dtype=float)
    patches = np.array([s.vit_patches for s in samples], dtype=float)
    stats = {**_percentile_stats("text_tokens", text), **_percentile_stats("vit_patches", patches)}
    stats["vit_patches.frac_gt_4096"] = float(np.mean(patches > 4096))
    stats["vit_patches.spread_p95_p5"] = stats["vit_patches.p95"] / stats["vit_patches.p5"]
    if cost is not None:
        works = sample_works(samples, cost)
        enc = np.array([w.encoder for w in works])
        ratio = enc / np.array([w.llm for w in works])
        stats.update(_percentile_stats("encoder_llm_ratio", ratio))
        stats["encoder_llm_ratio.spread_p95_p5"] = (
            stats["encoder_llm_ratio.p95"] / stats["encoder_llm_ratio.p5"]
        )
        stats["encoder_llm_ratio.spread_p99_p1"] = (
            stats["encoder_llm_ratio.p99"] / stats["encoder_llm_ratio.p1"]
        )
        stats["encoder_llm_ratio.spread_p75_p25"] = (
            stats["encoder_llm_ratio.p75"] / stats["encoder_llm_ratio.p25"]
        )
        stats.update({f"disttrain_vision.{k}": v for k, v in disttrain_variability(enc).items()})
    return stats


@cache
def _cost(model: str, hardware: str, attention: str | None = None) -> CostModel:
    """``presets.resolve_cost_model``'s preset, once per setup (the bounds share a few)."""
    from entrain.core.costs.presets import resolve_cost_model

    return resolve_cost_model(model, hardware=hardware, attention=attention)


def setup_of(entry: dict, bounds: dict) -> tuple[str, str, str | None]:
    """``(model, hardware, attention)`` a bound or relation is priced with: its ``setup``, else the
    file's ``draw`` (attention ``None``: the hardware preset's default)."""
    setup = {**bounds["draw"], **entry.get("setup", {})}
    return setup["model"], setup["hardware"], setup.get("attention")


@cache
def _measure_cached(dataset: str, num_samples: int, seed: int, setup: tuple) -> dict[str, float]:
    return measure(dataset, num_samples, seed, _cost(*setup))


def measure_for_bounds(dataset: str, bounds: dict, entry: dict | None = None) -> dict[str, float]:
    """The statistics of ``dataset`` on the file's draw, priced with ``entry``'s setup (memoised)."""
    draw = bounds["draw"]
    return _measure_cached(dataset, draw["num_samples"], draw["seed"], setup_of(entry or {}, bounds))


def report(update: bool = False) -> str:
    """Every bound next to the value measured now; ``update`` stores those values as ``measured``."""
    bounds = load_bounds()
    lines = [f"{'dataset':<18}{'stat':<34}{'min':>9}{'max':>9}{'now':>10}  status"]
    for b in bounds["bounds"]:
        now = measure_for_bounds(b["dataset"], bounds, b)[b["stat"]]
        ok = b["min"] <= now <= b["max"]
        lines.append(f"{b['dataset']:<18}{b['stat']:<34}{b['min']:>9.4g}{b['max']:>9.4g}{now:>10.4g}  "
                     f"{b['status']}{'' if ok or b['status'] == 'deviates' else ' FAILS'}")  # fmt: skip
        if update:
            b["measured"] = round(now, 4)
    for r in bounds["relations"]:
        where = "" if "setup" not in r else " [" + "/".join(str(v) for v in setup_of(r, bounds)) + "]"
        lines.append(f"relation {r['kind']:<10} {r['stat']}{where}: " + ", ".join(
            f"{d}={measure_for_bounds(d, bounds, r)[r['stat']]:.4g}" for d in _relation_datasets(r)))  # fmt: skip
    if update:
        with open(BOUNDS_PATH, "w", encoding="utf-8") as f:
            json.dump(bounds, f, indent=1, ensure_ascii=False)
            f.write("\n")
    return "\n".join(lines)


def _relation_datasets(r: dict) -> list[str]:
    if "datasets" in r:
        return r["datasets"]
    if "among" in r:
        return [r["dataset"], *r["among"]]
    return [r["numerator"], r["denominator"]]
