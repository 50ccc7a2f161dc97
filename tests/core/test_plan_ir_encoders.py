"""Plans with two encoder pipelines (vision, audio) feeding one LLM: the IR's layout, its JSON, the
dependency graph, the validator, the lowering and the NCCL point-to-point checker (docs/design.md,
"N encoders")."""

import json
from dataclasses import replace

import pytest

from entrain.core.errors import ScheduleError
from entrain.core.ir.graph import Message, ReplicaGraph
from entrain.core.ir.p2p import layout_channels
from entrain.core.ir.p2p_check import check_plan
from entrain.core.ir.plan import Action, ComponentLayout, Layout, Plan, StageSpec
from entrain.core.ir.validate import messages_of, validate_plan
from entrain.core.schedules.common import entrain_specs
from entrain.core.schedules.lowering import add_comms, strip_comms
from entrain.core.workload.work import SampleWork
from entrain.sim.executor import simulate_plan
from tests.sim import two_encoder_fixtures as two
from tests.sim.fixtures import deferral_assignment, disjoint_layout, raw_samples


def test_two_encoder_plan_round_trips_through_json():
    plan = two.plan()
    text = plan.dumps()
    back = Plan.loads(text)
    assert back == plan
    assert back.dumps() == text
    d = json.loads(text)
    assert [s.get("encoder") for s in d["layout"]["stages"]] == ["vision", "audio", None]
    assert set(d["layout"]["components"]) == {"vision", "audio", "llm"}
    assert d["samples"][0]["encoders"] == [3.0, 9.0]


def test_one_encoder_stage_and_sample_json_have_no_new_keys():
    spec = StageSpec(0, "encoder", 0, 2, 0)
    assert spec.to_json() == {"stage": 0, "component": "encoder", "layers": [0, 2], "pp_rank": 0}
    lay = Layout(1, 1, 1, {"encoder": ComponentLayout(), "llm": ComponentLayout()}, (spec,))
    one = Plan("x", lay, (), {"x": SampleWork("x", 1.0, 2.0)})
    assert one.to_json()["samples"] == [{"id": "x", "encoder": 1.0, "llm": 2.0}]
    assert Plan.loads(one.dumps()).samples["x"].encoders == ()


def test_layout_neighbours_of_two_encoder_pipelines():
    lay = two.layout()
    assert lay.multi_encoder and lay.encoder_names == ("vision", "audio")
    assert lay.encoder_groups == ((0,), (1,))
    assert [lay.next_stage(s) for s in range(3)] == [2, 2, None]
    assert [lay.prev_stages(s) for s in range(3)] == [(), (), (0, 1)]
    assert layout_channels(lay) == [(0, 2), (1, 2), (2, 0), (2, 1)]
    assert not lay.can_move_encoder_work


def test_one_encoder_layout_neighbours_unchanged():
    stages = (
        StageSpec(0, "encoder", 0, 1, 0),
        StageSpec(1, "encoder", 1, 2, 1),
        StageSpec(2, "llm", 0, 1, 2),
    )
    lay = Layout(1, 1, 2, {"encoder": ComponentLayout(pp=2), "llm": ComponentLayout()}, stages)
    assert not lay.multi_encoder and lay.encoder_groups == ((0, 1),)
    assert [lay.next_stage(s) for s in range(3)] == [1, 2, None]
    assert [lay.prev_stages(s) for s in range(3)] == [(), (0,), (1,)]


def test_first_llm_stage_consumes_every_encoder_message():
    plan = two.plan()
    graph = ReplicaGraph(plan.layout, plan.iterations[0].microbatches[0])
    assert graph.fwd_inputs(2, 1, 0) == [Message("F", 0, 2, 1, 0), Message("F", 1, 2, 1, 0)]
    assert graph.bwd_outputs(2, 1, 0) == [Message("B", 2, 0, 1, 0), Message("B", 2, 1, 1, 0)]
    assert graph.fwd_inputs(1, 0, 0) == []  # the audio pipeline's first stage has no input
    assert graph.fwd_outputs(0, 0, 0) == [Message("F", 0, 2, 0, 0)]
    assert graph.bwd_inputs(1, 0, 0) == [Message("B", 2, 1, 0, 0)]
    assert messages_of(plan.layout, Action.parse("2RECV_F1")) == (
        Message("F", 0, 2, 1, 0),
        Message("F", 1, 2, 1, 0),
    )
    assert messages_of(plan.layout, Action.parse("1SEND_F1")) == (Message("F", 1, 2, 1, 0),)


def test_sources_are_the_producers_of_the_messages_a_task_consumes():
    """``fwd_sources`` / ``bwd_sources`` (the predicted makespan's dependencies) name the tasks
    ``fwd_inputs`` and ``bwd_inputs`` + ``bwd_producers`` route, at the boundary of two encoder
    pipelines and on one chain with a deferred sample."""
    graphs = [ReplicaGraph(two.plan().layout, two.plan().iterations[0].microbatches[0])]
    samples = raw_samples({sid: (1.0, 1.0) for sid in "abcde"})
    rep = deferral_assignment([["a", "b"], ["c"], ["d", "e"]], {"b": (0, 1)})
    graphs.append(ReplicaGraph(disjoint_layout(2, 2, k=3), entrain_specs(rep, samples, 1, 2)))
    for graph in graphs:
        for stage in range(graph.num_stages):
            for _, m, u in graph.tasks(stage):
                fwd = [(msg.src, msg.mb, msg.sub) for msg in graph.fwd_inputs(stage, m, u)]
                bwd = [t for msg in graph.bwd_inputs(stage, m, u) for t in graph.bwd_producers(msg)]
                assert graph.fwd_sources(stage, m, u) == fwd
                assert graph.bwd_sources(stage, m, u) == bwd
    boundary = graphs[1]
    assert boundary.fwd_sources(2, 1, 0) == [(1, 0, 1), (1, 1, 0)]  # b: microbatch 0's deferred sub
    assert boundary.bwd_sources(1, 0, 1) == [(2, 1, 0)] and boundary.bwd_sources(3, 0, 0) == []


def test_validator_and_nccl_checker_accept_the_two_encoder_plan():
    plan = two.plan()
    validate_plan(plan)
    check_plan(plan)


def test_lowering_gives_one_boundary_action_per_label():
    plan = two.plan()
    it = plan.iterations[0]
    compute = {g: strip_comms(a) for g, a in it.actions.items()}
    lowered = add_comms(ReplicaGraph(plan.layout, it.microbatches[0]), compute)
    assert {g: " ".join(map(str, a)) for g, a in lowered.items()} == two.ACTIONS


@pytest.mark.parametrize(
    "rank, drop, message",
    [
        (1, "1SEND_F0", "1SEND_F0 is missing"),  # the audio encoder never sends: the LLM cannot wait for it
        (1, "1RECV_B0", "1RECV_B0 is missing"),
    ],
)
def test_validator_rejects_a_missing_encoder_message(rank, drop, message):
    actions = dict(two.ACTIONS)
    actions[rank] = " ".join(t for t in actions[rank].split() if t != drop)
    with pytest.raises(ScheduleError, match=message):
        validate_plan(two.plan(actions))


@pytest.mark.parametrize(
    "stages, comps, message",
    [
        (
            [("encoder", "vision", 0), ("encoder", "audio", 1), ("encoder", "vision", 2), ("llm", None, 3)],
            ("vision", "audio"),
            "consecutive",
        ),
        ([("encoder", "vision", 0), ("encoder", None, 1), ("llm", None, 2)], ("vision",), "every one names"),
        ([("encoder", "vision", 0), ("encoder", "audio", 1), ("llm", None, 2)], ("vision",), "audio"),
    ],
)
def test_layout_rejects_bad_encoder_groups(stages, comps, message):
    specs = tuple(StageSpec(i, c, 0, 1, r, encoder=e) for i, (c, e, r) in enumerate(stages))
    components = {n: ComponentLayout() for n in (*comps, "llm")}
    with pytest.raises(ValueError, match=message):
        Layout(1, 1, 1, components, specs)


def test_only_encoder_stages_name_an_encoder():
    with pytest.raises(ValueError, match="only encoder stages"):
        StageSpec(0, "llm", 0, 1, 0, encoder="vision")


def test_an_encoder_pipeline_sharing_the_first_llm_rank_hands_over_locally():
    """Audio's stage on the LLM's rank: the boundary RECV / SEND carry the vision message only, the
    audio output is taken on the rank; the plan validates, passes the NCCL checker and simulates to
    by hand: rank 1 runs audio F0 [0, 3], LLM F0 [3, 5], B0 [5, 9], audio B0 [9, 15], F1 [15, 16], LLM
    F1 [16, 17], B1 [17, 19], audio B1 [19, 21]; vision's B1 waits for the gradient sent at 19: [19.5,
    23.5]."""
    base = two.layout()
    stages = (base.stages[0], replace(base.stages[1], pp_rank=1), replace(base.stages[2], pp_rank=1))
    lay = Layout(1, 1, 2, base.components, stages)
    compute = {
        0: [Action.parse(t) for t in "0F0 0F1 0B0 0B1".split()],
        1: [Action.parse(t) for t in "1F0 2F0 2B0 1B0 1F1 2F1 2B1 1B1".split()],
    }
    plan = two.plan()
    graph = ReplicaGraph(lay, plan.iterations[0].microbatches[0])
    lowered = add_comms(graph, compute)
    assert (
        " ".join(map(str, lowered[1]))
        == "1F0 2RECV_F0 2F0 2B0 2SEND_B0 1B0 1F1 2RECV_F1 2F1 2B1 2SEND_B1 1B1"
    )
    assert messages_of(lay, Action.parse("2RECV_F0")) == (Message("F", 0, 2, 0, 0),)
    it = replace(plan.iterations[0], actions={g: tuple(a) for g, a in lowered.items()})
    local = Plan("hand", lay, (it,), plan.samples)
    validate_plan(local)
    check_plan(local)
    run = simulate_plan(local, None, costs=two.costs(local))[0]
    assert run.iteration_time_ms == pytest.approx(23.5)
    assert run.replicas[0].end_ms == pytest.approx({0: 23.5, 1: 21.0})
