"""Entrain's Plan for a model with two encoders (``planning.encoders_plan``): the configuration that
``search_encoders`` picks laid out as two encoder pipelines feeding the LLM, each global batch assigned
by ``assignment.multi_encoder`` (each encoder weighted by one over its group's GPUs), 1F1B with deferral
at each stage's depth; the plan validates, passes the NCCL checker, round-trips and simulates; the
registered systems refuse such a layout in one line."""

from __future__ import annotations

from functools import cache

import pytest

from entrain.core.assignment.multi_encoder import assign_multi_encoder
from entrain.core.errors import ConfigError
from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.p2p_check import check_plan
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.ir.plan import ActionKind, ComponentLayout, Layout, Plan, StageSpec
from entrain.core.ir.validate import validate_plan
from entrain.core.planning.encoders import encoder_works, search_encoders
from entrain.core.planning.encoders_plan import encoder_weights, encoders_compute, generate_encoders_plan
from entrain.core.schedules.common import plain_specs
from entrain.core.schedules.encoder_costs import EncodersPlanCosts
from entrain.core.systems import generate_plan
from entrain.sim.executor import simulate_plan
from tests.core.test_encoder_allocation import _encoders, _omni
from tests.sim.fixtures import plain_assignment


@cache
def _plan():
    encoders, samples = _encoders(), _omni(64)
    parallel = ParallelConfig(gpus=8, dp=1, tp=None, cp=1, global_batch=32, microbatch_size=4)
    best = search_encoders(samples[:32], encoders, parallel)[0]
    batches = [samples[:32], samples[32:]]
    return best, batches, generate_encoders_plan(batches, encoders, best)


def test_layout_is_the_searched_configuration_with_two_pipelines():
    best, _, plan = _plan()
    lay = plan.layout
    assert lay.encoder_names == ("vision", "audio")
    assert [len(g) for g in lay.encoder_groups] == [c.pp for c in best.encoders]
    for c in best.encoders:
        ranges = [(s.first_layer, s.end_layer) for s in lay.stages if s.encoder == c.name]
        assert ranges == list(c.layer_ranges)
        assert (lay.components[c.name].tp, lay.components[c.name].pp) == (c.tp, c.pp)
    assert lay.ranks_per_replica == len(lay.stages)  # one stage per rank, the pipelines apart


def test_plan_validates_passes_the_nccl_checker_and_round_trips():
    _, _, plan = _plan()
    validate_plan(plan)
    check_plan(plan)
    assert Plan.loads(plan.dumps()) == plan


def test_assignment_weights_each_encoder_by_its_group():
    best, batches, plan = _plan()
    assert encoder_weights(best) == tuple(1.0 / c.gpus for c in best.encoders)
    works = encoder_works(batches[0], _encoders())
    want = assign_multi_encoder(works, best.dp, best.num_microbatches, encoder_weights(best))
    assert plan.iterations[0].assignment.replicas == tuple(r.replica for r in want)
    for sid, w in zip((w.id for w in works), works):
        assert plan.samples[sid].encoders == w.encoders


def test_each_stage_warms_up_by_its_depth():
    """Vision (1 stage) and audio (2 stages) side by side before 2 LLM stages, 6 microbatches: each
    stage runs as many forwards before its first backward as stages follow it on its way, plus one
    (vision 3, audio 4 and 3, LLM 2 and 1), not the stage count's 1F1B warm-up."""
    stages = (
        StageSpec(0, "encoder", 0, 1, 0, encoder="vision"),
        StageSpec(1, "encoder", 0, 1, 1, encoder="audio"),
        StageSpec(2, "encoder", 1, 2, 2, encoder="audio"),
        StageSpec(3, "llm", 0, 1, 3),
        StageSpec(4, "llm", 1, 2, 4),
    )
    comps = {"vision": ComponentLayout(), "audio": ComponentLayout(pp=2), "llm": ComponentLayout(pp=2)}
    lay = Layout(1, 1, 6, comps, stages)
    graph = ReplicaGraph(lay, plain_specs(plain_assignment([[f"s{i}"] for i in range(6)])))
    order = encoders_compute(graph)
    before = []
    for s in range(5):
        acts = order[s]
        first_b = next(i for i, a in enumerate(acts) if a.kind is ActionKind.B)
        before.append(sum(a.kind is ActionKind.F for a in acts[:first_b]))
    assert before == [3, 4, 3, 2, 1]


def test_simulates_with_each_encoder_priced_apart():
    _, _, plan = _plan()
    costs = EncodersPlanCosts(plan.layout, _encoders(), plan.samples)
    runs = simulate_plan(plan, None, costs=costs)
    assert len(runs) == 2 and all(r.iteration_time_ms > 0 for r in runs)
    # the iteration is at least the busiest rank's compute
    for r in runs:
        assert r.iteration_time_ms >= max(r.replicas[0].busy_ms.values())


@pytest.mark.parametrize("system", ["1f1b", "disttrain", "entrain", "dip"])
def test_registered_systems_refuse_two_encoder_layouts_in_one_line(system):
    _, _, plan = _plan()
    with pytest.raises(ConfigError, match=r"encoders \['vision', 'audio'\] in separate pipelines") as e:
        generate_plan(system, plan.layout, [], plan.samples)
    assert "\n" not in str(e.value)


def test_search_with_dp_open_skips_replicas_too_small_for_every_component():
    """8 GPUs, DP open: DP 4 and 8 leave a replica fewer GPUs than its three components; the search
    tries DP 1 and 2 instead of failing on them."""
    parallel = ParallelConfig(gpus=8, dp=None, tp=1, cp=1, global_batch=32, microbatch_size=4)
    found = search_encoders(_omni(32), _encoders(), parallel)
    assert {c.dp for c in found} == {1, 2}
    with pytest.raises(ConfigError, match="at least 3 GPUs"):
        search_encoders(
            _omni(32),
            _encoders(),
            ParallelConfig(gpus=8, dp=4, tp=1, cp=1, global_batch=32, microbatch_size=4),
        )


def test_the_requested_microbatch_count_is_planned_and_chosen_by_simulation():
    """``K_eff`` on the bottleneck (vision) encoder leaves this draw's replica 2 microbatches of the 8
    requested (one image holds a third of the vision work); with ``microbatch_count`` ``"requested"``
    the plan has the 8 and carries the option; ``fit_entrain`` simulates both and takes it, faster and
    fitting, as its ``microbatch count`` decision."""
    from dataclasses import replace

    from entrain.core.planning.encoders_plan import below_requested
    from entrain.sim.encoders_run import MICROBATCH_COUNT, fit_entrain

    best, batches, plan = _plan()
    assert below_requested(plan) and plan.options == {}
    more = generate_encoders_plan(batches, _encoders(), replace(best, microbatch_count="requested"))
    k = best.num_microbatches
    assert all(rep.k_eff == k for it in more.iterations for rep in it.assignment.replicas)
    assert not below_requested(more) and more.options == {"microbatch_count": "requested"}
    validate_plan(more)
    check_plan(more)
    run, cfg, (d,) = fit_entrain(best, batches[:1], _encoders())
    assert (d.name, d.default, set(d.candidates)) == (MICROBATCH_COUNT, "paper", {"paper", "requested"})
    assert d.chosen == "requested" and d.candidates["requested"] < d.candidates["paper"]
    assert cfg.microbatch_count == "requested" and run.plan.options == {"microbatch_count": "requested"}
    assert run.metrics.fits_memory is not False
