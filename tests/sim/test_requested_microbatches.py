"""The memory check's requested-microbatch start (``sim.memory_fit``, ``ScheduleOptions.microbatch_count``):
where one sample dwarfs the rest, the paper's ``K_eff`` leaves a few large microbatches whose activations
need recomputation; the requested count's smaller microbatches hold fewer, so Entrain's memory check also
tries them and deploys them where they fit faster (mixture/Qwen3VL-8B in the workload zoo)."""

from __future__ import annotations

from dataclasses import replace

from entrain.core.assignment.stratified import effective_num_microbatches, microbatch_count
from entrain.core.planning.setups import SystemSetup
from entrain.core.workload.work import SampleWork
from entrain.sim.memory_fit import REQUESTED, fit_memory_best
from entrain.sim.run import run_system
from tests.sim.fixtures import disjoint_layout, toy_cost

K = 8


def _case():
    """One replica of 16 samples, one with 8x the others' encoder work: ``K_eff`` 2 of the 8 requested;
    device memory a little above the requested count's peak without recomputation."""
    cost = toy_cost(act_bytes_per_token=10.0, out_bytes_per_token=1.0)
    layout = disjoint_layout(2, 2, k=K)
    batch = [SampleWork(f"s{i:02d}", 800.0 if i == 0 else 100.0, 100.0) for i in range(16)]
    requested = {"microbatch_count": "requested"}
    peak = max(run_system("entrain", layout, [batch], cost, requested).metrics.peak_memory_bytes_per_rank)
    cost = replace(cost, hardware=replace(cost.hardware, device_memory_bytes=1.01 * peak))
    return cost, layout, [batch]


def test_the_requested_count_is_the_runs_own_at_most_one_per_sample():
    work = [800.0] + [100.0] * 15
    assert effective_num_microbatches(work, K) == microbatch_count(work, K) == 2
    assert microbatch_count(work, K, "requested") == K
    assert microbatch_count(work[:5], K, "requested") == 5
    assert microbatch_count(work, K, "double") == 2 * K  # twice the requested count: two samples each
    assert microbatch_count(work, 10, "double") == 16  # at most one per sample


def test_memory_check_deploys_the_requested_count_where_it_fits_without_recomputation():
    cost, layout, batches = _case()
    paper = run_system("entrain", layout, batches, cost, {})
    assert [r.k_eff for r in paper.plan.iterations[0].assignment.replicas] == [2]
    assert paper.metrics.fits_memory is False  # K_eff's two large microbatches overflow

    got, run = fit_memory_best("entrain", SystemSetup(layout, {}, ""), batches, cost)
    d = got.decisions[-1]
    assert d.name == "recompute" and d.chosen == REQUESTED, d.candidates
    assert got.options["microbatch_count"] == "requested"
    assert run.metrics.fits_memory is True
    assert [r.k_eff for r in run.plan.iterations[0].assignment.replicas] == [K]
    assert all(st.recompute == "none" for st in run.layout.stages)
    assert d.candidates[REQUESTED] < d.candidates["planner"]  # the paper's count needed recomputation
    # the deployed setup is plain data: its options rebuild the same plan (what train --plan runs)
    again = run_system("entrain", got.layout, batches, cost, dict(got.options))
    assert again.metrics.iteration_time_ms == run.metrics.iteration_time_ms


def test_baselines_and_fitting_plans_get_no_requested_start():
    cost, layout, batches = _case()
    got, _ = fit_memory_best("1f1b", SystemSetup(layout, {}, ""), batches, cost)
    assert REQUESTED not in got.decisions[-1].candidates  # 1F1B's batcher already makes K microbatches
    roomy = replace(cost, hardware=replace(cost.hardware, device_memory_bytes=1e18))
    got, _ = fit_memory_best("entrain", SystemSetup(layout, {}, ""), batches, roomy)
    assert list(got.decisions[-1].candidates) == ["planner"]  # nothing recomputed: nothing to try


def test_the_doubled_count_runs_twice_the_microbatches_of_half_the_size_with_fewer_activations_held():
    """``microbatch_count`` ``"double"``: each replica's encoder and LLM microbatches are twice the requested
    count (every sample in exactly one), the same samples and the same total work per rank, and the
    largest microbatch's activations, so the peak each rank holds, below the requested count's."""
    cost, layout, batches = _case()
    runs = {
        n: run_system("entrain", layout, batches, cost, {"microbatch_count": n})
        for n in ("requested", "double")
    }
    reps = {n: r.plan.iterations[0].assignment.replicas[0] for n, r in runs.items()}
    assert (reps["requested"].k_eff, reps["double"].k_eff) == (K, 2 * K)
    assert len(reps["double"].encoder_microbatches) == len(reps["double"].llm_microbatches) == 2 * K
    ids = sorted(s for mb in reps["double"].encoder_microbatches for s in mb)
    assert ids == sorted(w.id for w in batches[0])
    busy = {n: sorted(r.iterations[0].replicas[0].busy_ms.values()) for n, r in runs.items()}
    peaks = {n: max(r.metrics.peak_memory_bytes_per_rank) for n, r in runs.items()}
    assert peaks["double"] < peaks["requested"]
    assert sum(busy["double"]) >= sum(busy["requested"])  # more calls: per-call constants, never less work
