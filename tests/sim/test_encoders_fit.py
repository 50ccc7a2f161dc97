"""``entrain.sim.encoders_run.fit_recompute``: a two-encoder plan whose simulated peak on a pipeline
rank is over device memory gets that rank's stages one recomputation mode further, the other ranks'
stay as planned, and the actions are the plan's."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from entrain.cli.common import config_sampler, config_workload
from entrain.cli.main import build_parser
from entrain.cli.simulate import SimulateRequest, _encoders
from entrain.core.costs.costmodel import RECOMPUTE_MODES
from entrain.core.planning.encoders import Encoder
from entrain.core.planning.encoders_baselines import plan_encoders_system
from entrain.sim.encoders_run import encoders_profile, fit_recompute

OMNI = ["--model", "qwen25-omni-7b", "--dataset", "omni", "--hardware", "a40-flops", "--gpus", "4",
        "--dp", "1", "--global-batch", "8", "--microbatch-size", "2", "--iterations", "1"]  # fmt: skip


@cache
def _plan_and_encoders():
    c = SimulateRequest.from_args(build_parser().parse_args(["simulate", *OMNI])).config
    encoders = _encoders(c)
    _, profile = encoders_profile(config_sampler(c), encoders, c.parallel)
    batches = list(config_workload(c, c.model.cost_model()).batches(c.parallel.global_batch, 1))
    return plan_encoders_system("entrain", profile, batches, encoders, c.parallel), encoders


def _with_memory(encoders, limit: float) -> tuple[Encoder, ...]:
    def one(e: Encoder) -> Encoder:
        cost = replace(e.cost, hardware=replace(e.cost.hardware, device_memory_bytes=limit))
        return replace(e, cost=cost)

    return tuple(one(e) for e in encoders)


def test_over_full_ranks_recompute_one_mode_further_the_rest_stay():
    plan, encoders = _plan_and_encoders()
    first = fit_recompute(plan, _with_memory(encoders, 1e15))  # everything fits: the plan as it is
    assert first.plan == plan and first.metrics.fits_memory
    peaks = first.metrics.peak_memory_bytes_per_rank
    limit = (sorted(peaks)[0] + sorted(peaks)[1]) / 2  # only the emptiest rank fits
    run = fit_recompute(plan, _with_memory(encoders, limit))
    assert run.plan.iterations == plan.iterations
    assert [s.pp_rank for s in plan.layout.stages] == list(range(len(peaks)))  # one stage a rank
    for before, after, peak in zip(plan.layout.stages, run.layout.stages, peaks):
        if peak <= limit:
            assert after.recompute == before.recompute
        else:
            assert RECOMPUTE_MODES.index(after.recompute) > RECOMPUTE_MODES.index(before.recompute) or (
                before.recompute == "full" == after.recompute
            )
    got = run.metrics.peak_memory_bytes_per_rank
    assert all(g <= limit or s.recompute == "full" for g, s in zip(got, run.layout.stages))
    assert any(g < p for g, p in zip(got, peaks))
