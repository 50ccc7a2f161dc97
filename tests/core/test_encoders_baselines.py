"""DistTrain-like with two encoders (``planning.encoders_baselines``): one group per encoder with the
N-way search's degrees on its one profiled sample, data-order global microbatches, the batcher's
makespan over the bottleneck encoder pipeline and the LLM, 1F1B; the plan validates, passes the NCCL
checker and simulates."""

from __future__ import annotations

from functools import cache

import pytest

from entrain.core.errors import ConfigError
from entrain.core.ir.p2p_check import check_plan
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.ir.plan import Plan
from entrain.core.ir.validate import validate_plan
from entrain.core.planning.encoders import encoder_works, search_encoders
from entrain.core.planning.encoders_baselines import (
    bottleneck_chain,
    disttrain_encoders_config,
    disttrain_encoders_sample,
    generate_disttrain_encoders_plan,
    plan_encoders_system,
)
from entrain.core.planning.encoders_plan import generate_encoders_plan
from entrain.core.schedules.encoder_costs import EncodersPlanCosts
from entrain.core.systems import DISTTRAIN
from entrain.sim.executor import simulate_plan
from tests.core.test_encoder_allocation import _encoders, _omni
from tests.sim import two_encoder_fixtures as two

PARALLEL = ParallelConfig(gpus=8, dp=1, tp=None, cp=1, global_batch=32, microbatch_size=4)


@cache
def _plan():
    encoders, samples = _encoders(), _omni(64)
    cfg = disttrain_encoders_config(samples, encoders, PARALLEL)
    batches = [samples[:32], samples[32:]]
    return cfg, batches, generate_disttrain_encoders_plan(batches, encoders, cfg)


def test_profiled_sample_is_the_lower_median_ratio_and_sets_the_degrees():
    encoders, samples = _encoders(), _omni(64)
    works = encoder_works(samples, encoders)
    ratios = sorted((w.encoder / w.llm, w.id) for w in works)
    one = disttrain_encoders_sample(samples, encoders)
    assert one.id == ratios[(len(ratios) - 1) // 2][1]
    cfg, _, plan = _plan()
    assert cfg == search_encoders([one], encoders, PARALLEL)[0]
    assert plan.layout.encoder_names == ("vision", "audio") and plan.system == DISTTRAIN


def test_microbatches_are_data_order_global_microbatches():
    cfg, batches, plan = _plan()
    u = cfg.microbatch_size
    for batch, it in zip(batches, plan.iterations):
        chunks = {frozenset(s.id for s in batch[m * u : (m + 1) * u]) for m in range(len(batch) // u)}
        got = {frozenset(spec.encoder_ids) for spec in it.microbatches[0]}
        assert got == chunks
        assert all(spec.encoder_subs == spec.llm_subs for spec in it.microbatches[0])  # no deferral


def test_plan_validates_passes_the_nccl_checker_round_trips_and_simulates():
    _, _, plan = _plan()
    validate_plan(plan)
    check_plan(plan)
    assert Plan.loads(plan.dumps()) == plan
    costs = EncodersPlanCosts(plan.layout, _encoders(), plan.samples)
    assert all(r.iteration_time_ms > 0 for r in simulate_plan(plan, None, costs=costs))


def test_the_batchers_chain_is_the_bottleneck_encoder_pipeline():
    costs = two.costs()
    assert bottleneck_chain(costs, ["a"]) == (1, 2)  # audio 9 > vision 3
    assert bottleneck_chain(costs, ["b"]) == (0, 2)  # vision 6 > audio 3
    assert bottleneck_chain(costs, ["a", "b"]) == (1, 2)  # audio 12 > vision 9


def test_plan_encoders_system_dispatches_and_refuses_in_one_line():
    encoders, samples = _encoders(), _omni(64)
    batches = [samples[:32]]
    got = plan_encoders_system("entrain", samples[:32], batches, encoders, PARALLEL)
    best = search_encoders(samples[:32], encoders, PARALLEL)[0]
    assert got == generate_encoders_plan(batches, encoders, best)
    cfg = disttrain_encoders_config(samples[:32], encoders, PARALLEL)
    got = plan_encoders_system(DISTTRAIN, samples[:32], batches, encoders, PARALLEL)
    assert got == generate_disttrain_encoders_plan(batches, encoders, cfg)
    for system, message in (("1f1b", "one encoder component"), ("dip", "not planned by this system yet")):
        with pytest.raises(ConfigError, match=message) as e:
            plan_encoders_system(system, samples[:32], batches, encoders, PARALLEL)
        assert "\n" not in str(e.value)
