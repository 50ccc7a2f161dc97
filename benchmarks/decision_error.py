"""The simulator's error on Entrain's automatic decisions (docs/planner.md, "Decisions by simulation";
``entrain.core.planning.setups.DECISION_MARGIN``): for each regression case given, every decision's
candidate/default ratio simulated on the judge's draws (the planner's profiler, trials 0 and 1) and on
two other draws of the same profiler (trials 2 and 3). The difference of two independent estimates
has twice the variance of one, so one estimate's error is about |difference| / sqrt(2).

    python benchmarks/decision_error.py synthchartnet/1B/a40-paper/seed3 cocoqa/1B/a40-paper/seed0 ...

Pairs whose candidates run the same plan (ratio exactly 1 on both) are left out."""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from regression import load_baseline  # noqa: E402

from entrain.cli.common import resolve_cost_model, vision_limits  # noqa: E402
from entrain.cli.main import build_parser  # noqa: E402
from entrain.config import RunConfig  # noqa: E402
from entrain.core.costs.sampler import MacroscopicProfiler  # noqa: E402
from entrain.core.planning.setups import system_setups  # noqa: E402
from entrain.core.workload.work import SampleWork  # noqa: E402
from entrain.data.sampling import dataset_sampler  # noqa: E402
from entrain.sim import choose  # noqa: E402


def _case(key: str):
    args = build_parser().parse_args(load_baseline()["cases"][key]["argv"])
    cost = resolve_cost_model(args)
    req = replace(RunConfig.from_args(args).config_request(), model=cost.model)
    return req, cost, dataset_sampler(args.dataset, args.seed, vision=vision_limits(args))


def _other_draws(sampler, cost, req, trials=(2, 3)) -> list[list[SampleWork]]:
    profiler = MacroscopicProfiler(sampler, cost, seed=req.seed)
    out = []
    for t in trials:
        items = profiler.draw(req.global_batch, t)[0]
        works = [w if isinstance(w, SampleWork) else cost.sample_work(w, req.tp, 1) for w in items]
        out.append([replace(w, id=f"{w.id}#{i}") for i, w in enumerate(works)])
    return out


def case_errors(key: str) -> list[tuple[str, float, float]]:
    """``(candidate vs default, ratio on the judge's draws, ratio on the other draws)`` per pair."""
    req, cost, sampler = _case(key)
    calls = []
    judge = choose.candidate_judge(sampler, cost, req)
    system_setups(["entrain"], req, cost, sampler, lambda c: calls.append((c, judge(c))) or calls[-1][1])
    other = _other_draws(sampler, cost, req)
    saved, choose.planner_draws = choose.planner_draws, lambda *a, **k: other
    try:
        again = choose.candidate_judge(sampler, cost, req)
        return [row for cands, ms in calls if len(cands) > 1 for row in _ratios(cands, ms, again(cands))]
    finally:
        choose.planner_draws = saved


def _ratios(cands: dict, ms: dict, ms2: dict) -> list[tuple[str, float, float]]:
    default = next(iter(cands))
    rows = []
    for name in list(cands)[1:]:
        r1, r2 = ms[name] / ms[default], ms2[name] / ms2[default]
        if math.isfinite(r1) and math.isfinite(r2) and not r1 == r2 == 1.0:
            rows.append((f"{name} vs {default}", r1, r2))
    return rows


def main(keys: list[str]) -> None:
    errors = []
    for key in keys:
        for pair, r1, r2 in case_errors(key):
            errors.append(abs(r1 - r2) / math.sqrt(2))
            print(f"{key}: {pair}: {r1:.4f} on the judge's draws, {r2:.4f} on two others", flush=True)
    print(f"one estimate's error (|difference| / sqrt 2): median {statistics.median(errors):.2%}, "
          f"max {max(errors):.2%}, {len(errors)} pairs")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
