"""Baselines with two encoders (``planning.encoders_baselines``). DistTrain-like: one group per encoder
with the N-way search's degrees on its one profiled sample, data-order global microbatches, the
batcher's makespan over the bottleneck encoder pipeline and the LLM, 1F1B. DIP-like: a chunk of every
modality on every rank, one sequence of encoder subs under every encoder's cap, the phase order or the
greedy interleaver. Each plan validates, passes the NCCL checker and simulates."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.errors import ConfigError
from entrain.core.ir.p2p_check import check_plan
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.ir.plan import Plan
from entrain.core.ir.validate import validate_plan
from entrain.core.planning.encoders import encoder_works, search_encoders, vision_units
from entrain.core.planning.encoders_baselines import (
    DIP_PROFILE_SAMPLES,
    bottleneck_chain,
    cut_by_caps,
    dip_encoders_caps,
    disttrain_encoders_config,
    disttrain_encoders_sample,
    generate_disttrain_encoders_plan,
    plan_encoders_system,
)
from entrain.core.planning.encoders_plan import generate_encoders_plan
from entrain.core.schedules.encoder_costs import EncodersPlanCosts
from entrain.core.systems import DIP, DIP_GREEDY, DISTTRAIN
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
    for system, message in (("1f1b", "one encoder component"), ("dflop", "not planned by this system yet")):
        with pytest.raises(ConfigError, match=message) as e:
            plan_encoders_system(system, samples[:32], batches, encoders, PARALLEL)
        assert "\n" not in str(e.value)


# --- DIP-like with two encoders ------------------------------------------------------------------------
@cache
def _dip(system: str = DIP):
    encoders, samples = _encoders(), _omni(64)
    return plan_encoders_system(system, samples[:32], [samples[:32], samples[32:]], encoders, PARALLEL)


def test_dip_colocates_a_chunk_of_every_modality_on_every_rank():
    """DP 1 at 8 GPUs: 8 ranks, each holding one chunk of the vision tower, of the audio tower and of the
    LLM, each modality's layers all covered in order; its 4-sample profile's caps in the options."""
    plan = _dip()
    lay = plan.layout
    assert plan.system == DIP and lay.encoder_names == ("vision", "audio") and lay.dp == 1
    assert lay.ranks_per_replica == 8 and all(c.pp == 8 for c in lay.components.values())
    for r in range(8):
        held = [s.encoder or s.component for s in lay.stages_of(r)]
        assert held == ["vision", "audio", "llm"], (r, held)
    for name in ("vision", "audio", "llm"):
        mine = [s for s in lay.stages if (s.encoder or s.component) == name]
        assert mine[0].first_layer == 0 and all(a.end_layer == b.first_layer for a, b in zip(mine, mine[1:]))
    four = _omni(64)[:DIP_PROFILE_SAMPLES]
    caps, llm_cap = dip_encoders_caps(four, _encoders())
    assert plan.options == {"dip_encoder_caps": caps, "dip_llm_cap_tokens": llm_cap}
    assert caps["vision"] == 2 * sum(sum(vision_units(m)) for m in four) / 4


def test_dip_cuts_one_sequence_of_encoder_subs_under_every_encoders_cap():
    """Parent microbatches in data order (the ``dip`` batcher's); every encoder sub of several samples
    within both caps, every cut forced (the next sample would pass a cap), the LLM subs under theirs."""
    plan = _dip()
    caps, llm_cap = plan.options["dip_encoder_caps"], plan.options["dip_llm_cap_tokens"]
    encoders = _encoders()

    def sizes(sid):
        meta = plan.samples[sid].meta
        return [sum(e.units(meta)) for e in encoders]

    subs_seen = 0
    for it in plan.iterations:
        for spec in it.microbatches[0]:
            subs = spec.encoder_subs
            subs_seen += len(subs)
            for sub in subs:
                totals = [sum(x) for x in zip(*(sizes(s) for s in sub))]
                assert len(sub) == 1 or all(
                    caps[e.name] is None or t <= caps[e.name] for t, e in zip(totals, encoders)
                ), sub
            for a, b in zip(subs, subs[1:]):
                grown = [sum(x) for x in zip(*(sizes(s) for s in (*a, b[0])))]
                assert any(caps[e.name] is not None and t > caps[e.name] for t, e in zip(grown, encoders)), (
                    a,
                    b,
                )
            for sub in spec.llm_subs:
                assert len(sub) == 1 or sum(plan.samples[s].meta.llm_tokens for s in sub) <= llm_cap
    assert subs_seen > sum(len(it.microbatches[0]) for it in plan.iterations)  # the caps cut


@settings(deadline=None, max_examples=60)
@given(
    st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=0, max_size=12),
    st.integers(1, 12),
    st.one_of(st.none(), st.integers(1, 12)),
)
def test_cut_by_caps_keeps_order_and_cuts_only_where_a_cap_forces_it(sizes, cap0, cap1):
    ids = [f"s{i}" for i in range(len(sizes))]
    caps = (cap0, cap1)
    groups = cut_by_caps(ids, sizes, caps)
    assert [s for g in groups for s in g] == ids
    size = dict(zip(ids, sizes))

    def within(group):
        totals = [sum(size[s][e] for s in group) for e in range(2)]
        return all(c is None or t <= c for t, c in zip(totals, caps))

    assert all(len(g) == 1 or within(g) for g in groups)
    assert all(not within((*a, b[0])) for a, b in zip(groups, groups[1:]))


@pytest.mark.parametrize("system", [DIP, DIP_GREEDY])
def test_dip_plans_validate_pass_the_nccl_checker_and_simulate(system):
    plan = _dip(system)
    validate_plan(plan)
    check_plan(plan)
    assert Plan.loads(plan.dumps()) == plan
    costs = EncodersPlanCosts(plan.layout, _encoders(), plan.samples)
    runs = simulate_plan(plan, None, costs=costs)
    assert all(r.iteration_time_ms > 0 for r in runs)
    if system == DIP_GREEDY:  # the interleaver reorders the phase order's queue, same work
        phase = _dip(DIP)
        assert plan.iterations[0].microbatches == phase.iterations[0].microbatches
        assert plan.iterations[0].actions != phase.iterations[0].actions


def test_dip_refuses_more_ranks_than_a_modality_has_layers():
    """64 GPUs in one replica: 64 colocated ranks, more than a tower's (and the LLM's) layers."""
    encoders, samples = _encoders(), _omni(64)
    wide = ParallelConfig(gpus=64, dp=1, tp=1, cp=1, global_batch=32, microbatch_size=4)
    with pytest.raises(ConfigError, match=r"dip: encoder '\w+' on 64 colocated ranks: ") as e:
        plan_encoders_system(DIP, samples[:32], [samples[:32]], encoders, wide)
    assert "\n" not in str(e.value)
