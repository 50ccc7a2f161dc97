import pytest
from hypothesis import given
from hypothesis import strategies as st

from entrain.core.ir.microbatches import Deferral, IterationAssignment, ReplicaAssignment
from entrain.core.ir.plan import (
    Action,
    ActionKind,
    ComponentLayout,
    IterationPlan,
    Layout,
    MicrobatchSpec,
    Plan,
    StageSpec,
)
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork


@given(
    st.integers(0, 99),
    st.sampled_from(list(ActionKind)),
    st.integers(0, 999),
    st.one_of(st.none(), st.integers(0, 9)),
)
def test_action_text_round_trip(stage, kind, mb, sub):
    a = Action(stage, kind, mb, sub)
    assert Action.parse(str(a)) == a


@pytest.mark.parametrize("bad", ["", "F0", "2X0", "2F", "2F0.", "a2F0"])
def test_action_parse_rejects(bad):
    with pytest.raises(ValueError, match="not an action"):
        Action.parse(bad)


def _tiny_plan() -> Plan:
    layout = Layout(
        dp=1,
        microbatch_size=1,
        num_microbatches=2,
        components={"encoder": ComponentLayout(pp=1), "llm": ComponentLayout(pp=1)},
        stages=(StageSpec(0, "encoder", 0, 3, 0), StageSpec(1, "llm", 0, 5, 1)),
    )
    rep = ReplicaAssignment(
        k_eff=2,
        encoder_microbatches=(("a", "b"), ("c",)),
        llm_microbatches=(("a",), ("c", "b")),
        execution_order=(0, 1),
        deferrals=(Deferral("b", 0, 1),),
        encoder_work=(2.0, 1.0),
        llm_work=(1.0, 2.0),
    )
    mbs = (
        MicrobatchSpec(0, 0, (("a",), ("b",)), (("a",),)),
        MicrobatchSpec(1, 1, (("c",),), (("c", "b"),)),
    )
    acts = {
        0: tuple(Action.parse(x) for x in "0F0.0 0SEND_F0.0 0F0.1 0SEND_F0.1".split()),
        1: tuple(Action.parse(x) for x in "1RECV_F0.0 1F0".split()),
    }
    samples = {
        "a": SampleWork("a", 1.0, 1.0, SampleMeta("a", ((56, 56),), 10)),
        "b": SampleWork("b", 1.0, 1.0),
        "c": SampleWork("c", 1.0, 1.0),
    }
    return Plan(
        "entrain", layout, (IterationPlan(IterationAssignment((rep,)), (mbs,), acts),), samples, {"x": 1}
    )


def test_plan_json_round_trip():
    plan = _tiny_plan()
    again = Plan.loads(plan.dumps())
    assert again == plan
    assert again.layout.world_size == 2
    assert again.layout.replica_of(1) == (0, 1)
    assert again.iterations[0].assignment.replicas[0].deferred_from(0) == ("b",)


def test_replica_assignment_checks_shape():
    with pytest.raises(ValueError, match="permutation"):
        ReplicaAssignment(1, (("a",),), (("a",),), (1,))
    with pytest.raises(ValueError, match="k_eff"):
        ReplicaAssignment(2, (("a",),), (("a",),), (0,))


def test_plan_json_keeps_the_pixel_limits_samples_were_counted_under():
    """A plan of ``--max-pixels`` samples prices the same images after plan.json (the
    simulator once re-read them at the default limits and priced a 640 x 480 photo as 1.5K patches,
    not 256)."""
    from entrain.core.workload.samples import pixel_limits

    vision = pixel_limits(None, 224 * 224)
    plan = _tiny_plan()
    small = SampleMeta("d", ((480, 640),), 12, vision)
    plan.samples["d"] = SampleWork("d", 1.0, 1.0, small)
    again = Plan.loads(plan.dumps()).samples
    assert (
        again["d"].meta.vit_patches
        == small.vit_patches
        <= 256
        < SampleMeta("d", ((480, 640),), 12).vit_patches
    )
    assert again["d"].meta.vision == vision and again["a"].meta.vision == plan.samples["a"].meta.vision
    assert "vision" not in plan.to_json()["samples"][0]["meta"]  # default limits: the file is unchanged


def test_plan_json_round_trips_the_message_parts_of_a_stage():
    """A stage's message parts besides ``hidden`` (name, width, dtype size, rows) survive plan.json; a
    stage without any writes no ``parts`` key (every existing plan file is unchanged)."""
    from dataclasses import replace

    from entrain.core.model.layer_specs import MessagePart

    plan = _tiny_plan()
    parts = (MessagePart("deep_0", 16, 2, "tokens", 0.25), MessagePart("deep_1", 16, 4, "image_tokens"))
    stages = (replace(plan.layout.stages[0], parts=parts), plan.layout.stages[1])
    plan = replace(plan, layout=replace(plan.layout, stages=stages))
    again = Plan.loads(plan.dumps())
    assert again == plan and again.layout.stages[0].parts == parts
    assert again.layout.stages[0].part_names == ("hidden", "deep_0", "deep_1")
    assert "parts" not in plan.to_json()["layout"]["stages"][1]
    assert "parts" not in _tiny_plan().to_json()["layout"]["stages"][0]


@pytest.mark.parametrize(
    "name, rows, error",
    [("hidden", "tokens", "not 'hidden'"), ("Deep", "tokens", "a-z"), ("deep", "pixels", "rows")],
)
def test_a_bad_message_part_is_refused(name, rows, error):
    from entrain.core.model.layer_specs import MessagePart

    with pytest.raises(ValueError, match=error):
        MessagePart(name, 8, rows=rows)


def test_a_stage_whose_parts_repeat_a_name_is_refused():
    from entrain.core.model.layer_specs import MessagePart

    with pytest.raises(ValueError, match="repeat a name"):
        StageSpec(0, "encoder", 0, 3, 0, parts=(MessagePart("deep", 8), MessagePart("deep", 8)))
