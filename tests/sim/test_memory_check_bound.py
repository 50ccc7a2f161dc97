"""The plan's memory check at low DP: where a replica iteration holds many
microbatches, ``memory_check_iterations`` simulates fewer global batches (as many (replica,
microbatch) pairs as the paper's setup checks): the heaviest of the batches the full check would
simulate (``costs.memory.heaviest_batches``). Here that gives the full check's verdict (the
recomputation chosen per rank, and that it fits) where the first batches alone do not."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from entrain.core.costs.memory import heaviest_batches, memory_check_iterations
from entrain.core.planning.setups import SystemSetup
from entrain.core.workload.work import SampleWork
from entrain.sim.memory_fit import fit_memory_best
from entrain.sim.run import run_system
from tests.sim.fixtures import disjoint_layout, toy_cost

DP, K, ITERATIONS = 2, 16, 12


def _batches() -> list[list[SampleWork]]:
    rng = np.random.default_rng(7)
    works = rng.lognormal(4.5, 0.6, (ITERATIONS, DP * K, 2))  # heavy-tailed encoder and LLM work
    return [[SampleWork(f"i{i}s{j}", *map(float, w)) for j, w in enumerate(it)] for i, it in enumerate(works)]


def _verdict(layout, batches, cost):
    got, run = fit_memory_best("entrain", SystemSetup(layout, {}, ""), batches, cost)
    return [
        (s.pp_rank, s.first_layer, s.end_layer, s.recompute) for s in got.layout.stages
    ], run.metrics.fits_memory


def test_bounded_memory_check_gives_the_full_checks_verdict():
    layout = disjoint_layout(2, 2, dp=DP, k=K)
    batches = _batches()
    cost = toy_cost(act_bytes_per_token=10.0, out_bytes_per_token=1.0)
    peaks = run_system("entrain", layout, batches, cost, {}).metrics.peak_memory_bytes_per_rank
    cost = replace(cost, hardware=replace(cost.hardware, device_memory_bytes=0.8 * max(peaks)))
    # scaled to this toy: 64 replica microbatches (the real 2560 at 512 microbatches a replica)
    num = memory_check_iterations(DP, ITERATIONS, num_microbatches=K, replica_microbatches=64)
    assert num == 2
    full = _verdict(layout, batches, cost)
    assert full[1] is True and {m[3] for m in full[0]} != {"none"}  # it recomputes
    picked = heaviest_batches(batches, num, window=layout.ranks_per_replica)
    assert _verdict(layout, [batches[i] for i in picked], cost) == full
    assert _verdict(layout, batches[:num], cost) != full  # the first batches miss the peak
