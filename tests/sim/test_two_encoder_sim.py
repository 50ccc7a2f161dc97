"""The simulator on a plan with two encoder pipelines: both run side by side on their own ranks, the
first LLM stage waits for every encoder's message of a microbatch, each transfer priced, each encoder
priced by its own cost model and units (docs/design.md, "N encoders")."""

import pytest

from entrain.core.errors import ConfigError, ScheduleError
from entrain.core.ir.plan import ActionKind, Plan
from entrain.core.planning.encoders import audio_units, vision_units
from entrain.core.schedules.encoder_costs import EncodersPlanCosts, encoder_view
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork
from entrain.sim.executor import simulate_plan
from entrain.sim.metrics import compute_metrics, rank_chains
from tests.sim import two_encoder_fixtures as two
from tests.sim.fixtures import toy_cost


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
