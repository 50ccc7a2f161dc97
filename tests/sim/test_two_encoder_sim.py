"""The simulator on a plan with two encoder pipelines: both run side by side on their own ranks, the
first LLM stage waits for every encoder's message of a microbatch, each transfer priced, each encoder
priced by its own cost model and units (docs/design.md, "N encoders")."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.costs.presets import build_cost_model
from entrain.core.errors import ConfigError, ScheduleError
from entrain.core.ir.p2p_check import check_plan
from entrain.core.ir.plan import ActionKind, ComponentLayout, Layout, Plan, StageSpec
from entrain.core.ir.validate import validate_plan
from entrain.core.model.architectures import get_arch
from entrain.core.planning.encoders import (
    QWEN25_OMNI_7B_AUDIO,
    Encoder,
    audio_tower_specs,
    audio_units,
    price_encoder,
    vision_units,
)
from entrain.core.planning.encoders_plan import encoders_compute
from entrain.core.schedules.common import build_plan, entrain_specs
from entrain.core.schedules.encoder_costs import EncodersPlanCosts, encoder_view
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork
from entrain.sim.executor import simulate_plan
from entrain.sim.metrics import compute_metrics, rank_chains
from tests.core.test_encoder_allocation import HARDWARE, MODEL, _encoders
from tests.sim import two_encoder_fixtures as two
from tests.sim.fixtures import deferral_assignment, draw_grouped_work, one_iteration, split, toy_cost


def test_time_is_the_hand_computed_critical_path():
    plan = two.plan()
    run = simulate_plan(plan, None, costs=two.costs(plan))[0]
    assert run.iteration_time_ms == pytest.approx(two.EXPECTED_MS)
    assert run.replicas[0].end_ms == pytest.approx(two.EXPECTED_ENDS)


def test_free_transfers_and_compute_only_orders():
    plan = two.plan()
    # without transfer times: LLM F0 [3, 5], B0 [5, 9], F1 [9, 10], B1 [10, 12];
    # vision B0 [9, 11], B1 [12, 16]; audio B0 [9, 15], B1 [15, 17]
    run = simulate_plan(plan, None, comm=False, costs=two.costs(plan))[0]
    assert run.iteration_time_ms == pytest.approx(17.0)
    it = plan.iterations[0]
    bare = {g: tuple(a for a in acts if a.kind.is_compute) for g, acts in it.actions.items()}
    compute_only = Plan(
        plan.system, plan.layout, (type(it)(it.assignment, it.microbatches, bare),), plan.samples
    )
    run = simulate_plan(compute_only, None, costs=two.costs(compute_only))[0]
    assert run.iteration_time_ms == pytest.approx(two.EXPECTED_MS)


def test_each_encoder_stage_prices_its_own_work():
    c = two.costs()
    assert c.compute_ms(0, ActionKind.F, ("a",)) == pytest.approx(1.0)  # vision 3 / 3
    assert c.compute_ms(1, ActionKind.F, ("a",)) == pytest.approx(3.0)  # audio 9 / 3
    assert c.compute_ms(1, ActionKind.B, ("a",)) == pytest.approx(6.0)
    assert c.compute_ms(2, ActionKind.F, ("b",)) == pytest.approx(1.0)
    assert c.message_ms(1, ("a",)) == pytest.approx(two.LATENCY_MS)


def test_units_of_each_encoder_from_token_metadata():
    """With token metadata the vision stage counts the images' patches and the audio stage the clips'
    chunks (each encoder's ``units``), not every encoder unit of the sample."""
    meta = SampleMeta("m", ((224, 224),), 10, audio=(300,))
    assert vision_units(meta) and audio_units(meta)
    layout = two.layout()
    samples = {"m": SampleWork("m", 0.0, 0.0, meta)}
    cost = toy_cost(enc_layers=1, llm_layers=1, act_bytes_per_token=0.0)
    encs = (two.ToyEncoder("vision", cost, vision_units), two.ToyEncoder("audio", cost, audio_units))
    c = EncodersPlanCosts(layout, encs, samples)
    assert c.compute_ms(0, ActionKind.F, ("m",)) == pytest.approx(sum(vision_units(meta)))
    assert c.compute_ms(1, ActionKind.F, ("m",)) == pytest.approx(sum(audio_units(meta)))
    assert c.compute_ms(2, ActionKind.F, ("m",)) == pytest.approx(meta.llm_tokens)


def test_encoder_view_keeps_one_encoder_and_the_llm():
    view, where = encoder_view(two.layout(), "audio")
    assert [(s.stage, s.component, s.encoder) for s in view.stages] == [
        (0, "encoder", None),
        (1, "llm", None),
    ]
    assert where == {1: 0, 2: 1}
    assert set(view.components) == {"encoder", "llm"}


def test_a_two_encoder_plan_needs_each_encoders_costs():
    plan = two.plan()
    with pytest.raises(ScheduleError, match="needs each encoder's cost model"):
        simulate_plan(plan, two.encoders()[0].cost)
    with pytest.raises(ConfigError, match="do not match"):
        EncodersPlanCosts(plan.layout, two.encoders()[::-1], plan.samples)
    raw = {"a": SampleWork("a", 1.0, 1.0)}
    with pytest.raises(ConfigError, match="sample 'a'"):
        EncodersPlanCosts(plan.layout, two.encoders(), raw)


def test_metrics_read_the_encoder_pipelines_side_by_side():
    """Per rank and mean microbatch: vision F 1.5 B 3, audio F 2 B 4, LLM F 1.5 B 3. 1F1B of two
    microbatches over (audio, LLM) takes 15 ms, over (vision, LLM) 13.5: the partition ideal is 15,
    not the three-rank chain's. The ideal fills a two-rank way: (2 + 2 - 1) * 30 / (2 * 3) = 15."""
    plan = two.plan()
    costs = two.costs(plan)
    runs = simulate_plan(plan, None, costs=costs)
    assert rank_chains(plan.layout) == [[0, 2], [1, 2]]
    m = compute_metrics(plan.layout, runs, costs, plan.iterations)
    assert m.partition_ideal_ms == pytest.approx(15.0)
    assert m.ideal_ms == pytest.approx(15.0)
    assert m.lower_bound_ms == pytest.approx(12.0)  # the audio rank's compute
    assert m.iteration_time_ms == pytest.approx(two.EXPECTED_MS)


@st.composite
def _pipelines(draw):
    groups, works, deferred = draw_grouped_work(draw, st, max_mbs=5, max_per_mb=3, min_mbs=1)
    pps = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 2)))
    dp = draw(st.integers(1, 2))
    audio_share = draw(st.sampled_from([0.0, 0.3, 1.0]))  # 0: no audio at all (empty parts)
    return groups, works, deferred, pps, dp, audio_share


@settings(deadline=None, max_examples=40)
@given(w=_pipelines())
def test_depth_1f1b_with_deferral_is_valid_deadlock_free_and_accounted(w):
    """Random vision / audio / LLM stage counts, replicas, deferrals and audio shares: Entrain's
    two-encoder order validates, passes the NCCL checker, simulates, and each rank's busy time is the
    sum of its actions' prices; the iteration is at least the busiest rank's compute."""
    groups, works, deferred, (v_pp, a_pp, l_pp), dp, share = w
    stages, comps = [], {}
    for name, pp, kind in (("vision", v_pp, "encoder"), ("audio", a_pp, "encoder"), ("llm", l_pp, "llm")):
        for first, end in split(4, pp):
            s = len(stages)
            stages.append(StageSpec(s, kind, first, end, s, encoder=None if kind == "llm" else name))
        comps[name] = ComponentLayout(pp=pp)
    layout = Layout(dp, 1, len(groups), comps, tuple(stages))
    cost = toy_cost(enc_layers=4, llm_layers=4, call_ms=0.1, out_bytes_per_token=1e5, latency_ms=0.3)
    encs = (two.ToyEncoder("vision", cost), two.ToyEncoder("audio", cost))
    samples = {}
    for r in range(dp):
        for s, (enc, llm) in works.items():
            parts = (enc * (1 - share), enc * share)
            samples[f"{s}r{r}"] = SampleWork(f"{s}r{r}", enc, llm, None, parts)
    reps = [
        deferral_assignment(
            [[f"{s}r{r}" for s in g] for g in groups], {f"{s}r{r}": v for s, v in deferred.items()}
        )
        for r in range(dp)
    ]
    plan = build_plan("entrain", layout, one_iteration(*reps), samples, entrain_specs, encoders_compute, {})
    validate_plan(plan)
    check_plan(plan)
    costs = EncodersPlanCosts(layout, encs, samples)
    run = simulate_plan(plan, None, costs=costs)[0]
    it = plan.iterations[0]
    for rep in run.replicas:
        specs = it.microbatches[rep.replica]
        for g, busy in rep.busy_ms.items():
            expected = 0.0
            for a in it.actions[g]:
                if a.kind.is_compute:
                    enc = layout.stages[a.stage].component == "encoder"
                    ids = (specs[a.mb].encoder_subs if enc else specs[a.mb].llm_subs)[a.sub_index]
                    expected += costs.compute_ms(a.stage, a.kind, ids)
            assert busy == pytest.approx(expected)
    assert run.iteration_time_ms >= max(b for rep in run.replicas for b in rep.busy_ms.values()) * (1 - 1e-12)


def test_llm_sends_gradients_on_when_any_encoder_trains():
    """The vision tower frozen, the audio tower training: the first LLM stage computes its input
    gradient (its split backward's I costs time); with both frozen it does not."""
    arch = get_arch(MODEL)
    frozen = Encoder("vision", build_cost_model(arch, HARDWARE, freeze=("encoder",)), vision_units)
    audio = _encoders()[1]
    frozen_audio = Encoder(
        "audio",
        price_encoder(arch, audio_tower_specs(QWEN25_OMNI_7B_AUDIO), HARDWARE, freeze=("encoder",)),
        audio_units,
    )
    meta = SampleMeta("m", ((224, 224),), 10, audio=(300,))
    samples = {"m": SampleWork("m", 0.0, 0.0, meta)}
    base = two.layout()
    lay = Layout(1, 1, 2, base.components, (*base.stages[:2], replace(base.stages[2], end_layer=3)))
    training = EncodersPlanCosts(lay, (frozen, audio), samples)
    assert training.compute_ms(2, ActionKind.I, ("m",)) > 0
    none = EncodersPlanCosts(lay, (frozen, frozen_audio), samples)
    assert none.compute_ms(2, ActionKind.I, ("m",)) == 0
