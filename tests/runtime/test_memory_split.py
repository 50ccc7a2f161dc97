"""Entrain's memory split in the runtime: with full recomputation on the
encoder and a budget that holds one sample's recomputation transient but not a whole microbatch's, the
Plan cuts its encoder microbatches into sub-microbatches; on 2 forked gloo ranks it trains to the
gradients of the uncut Plan, and the encoder rank's measured peak tensor memory drops, as the
simulator predicts (``harness.PeakTensorMemory``)."""

from __future__ import annotations

from dataclasses import replace

from entrain.core.costs.presets import build_cost_model
from entrain.runtime.planning import make_plan
from entrain.sim.executor import simulate_plan

from .cases import one_sample_budget_bytes, plan_for, works
from .harness import relative_errors, run_workers
from .test_recompute import _metas, _train

K = 2  # 4 samples per microbatch


def _plans():
    cost = build_cost_model("tiny", "cpu-tiny")
    batch = works(_metas())
    base = plan_for("entrain", 1, 1, 1, K, batch)
    stages = tuple(
        replace(s, recompute="full") if s.component == "encoder" else s for s in base.layout.stages
    )
    layout = replace(base.layout, stages=stages)
    whole = make_plan("entrain", layout, [batch], cost, {"memory_split": False})
    budget = one_sample_budget_bytes(whole)
    cut = make_plan("entrain", layout, [batch], cost, {"memory_budget_bytes": budget})
    return {"whole": whole, "cut": cut}, cost


def test_cut_encoder_microbatches_keep_gradients_and_lower_the_encoder_peak(tmp_path):
    plans, cost = _plans()
    subs = {n: sum(len(m.encoder_subs) for m in p.iterations[0].microbatches[0]) for n, p in plans.items()}
    assert subs["cut"] > subs["whole"] and plans["cut"].options["memory_split"]["cuts"][0][0], subs
    predicted = {n: simulate_plan(p, cost)[0].replicas[0].peak_bytes[0] for n, p in plans.items()}
    assert predicted["cut"] < predicted["whole"], predicted
    results = run_workers(_train, 2, tmp_path, plans)
    grads = {n: {k: v for r in results for k, v in r[n][0].items()} for n in plans}
    errors = relative_errors(grads["cut"], grads["whole"])
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-6, f"{worst} relative error {errors[worst]:.3g}"
    measured = {n: results[0][n][1] for n in plans}
    assert measured["cut"] < measured["whole"], measured
    print(
        {n: f"{p / 1e6:.2f} MB" for n, p in measured.items()},
        {n: f"{p / 1e6:.2f} MB" for n, p in predicted.items()},
    )
