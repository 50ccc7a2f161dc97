"""The simulator runs an expert-parallel group's replicas in lockstep on their stages with experts:
with ``ep`` 2 the replica holding the light microbatch waits for the heavy one's at every sparse
layer, so each LLM action lasts the longer of the two, and starts on both when the later one can start
it (its input came last); the encoder's do not wait, nor does anything with ``ep`` 1 (every replica on
its own, as before). A trace refit measures such an action from the group's last start, on the
group's heaviest samples, as the simulator prices it."""

from __future__ import annotations

from entrain.core.ir.microbatches import IterationAssignment, ReplicaAssignment
from entrain.core.ir.plan import ActionKind, ComponentLayout, Layout, StageSpec
from entrain.core.systems import generate_plan
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork
from entrain.sim.executor import simulate_plan
from entrain.sim.trace_fit import TracedRun, traced_computes
from tests.moe_fixtures import tiny_moe_cost


def _layout(ep: int, dp: int = 2) -> Layout:
    return Layout(
        dp=dp,
        microbatch_size=1,
        num_microbatches=2,
        components={"encoder": ComponentLayout(), "llm": ComponentLayout(ep=ep)},
        stages=(StageSpec(0, "encoder", 0, 1, 0), StageSpec(1, "llm", 0, 1, 1)),
    )


def _samples(images: dict[str, tuple[int, int]] | None = None) -> dict[str, SampleWork]:
    # replica 0's first microbatch is heavy on the LLM; e..h: the other EP group at DP 4 (e heavier still)
    text = {"a": 2000, "b": 100, "c": 100, "d": 100, "e": 4000, "f": 100, "g": 100, "h": 100}
    metas = [SampleMeta(s, ((images or {}).get(s, (224, 224)),), t) for s, t in text.items()]
    return {m.id: SampleWork(m.id, 0.0, 0.0, m) for m in metas}


def _durations(ep: int, dp: int = 2) -> dict[tuple[int, int, str, int], float]:
    """(replica, stage, kind, mb) -> simulated duration."""
    reps = [(("a",), ("b",)), (("c",), ("d",)), (("e",), ("f",)), (("g",), ("h",))][:dp]
    it = IterationAssignment(tuple(ReplicaAssignment(2, r, r, (0, 1)) for r in reps))
    plan = generate_plan("1f1b", _layout(ep, dp), [it], _samples(), tiny_moe_cost())
    (run,) = simulate_plan(plan, tiny_moe_cost(), trace_iterations=1)
    layout = plan.layout
    return {
        (layout.replica_of(s.rank)[0], s.action.stage, s.action.kind.name, s.action.mb): s.end_ms - s.start_ms
        for r in run.replicas
        for s in r.spans
    }


def test_an_ep_group_waits_for_its_heaviest_microbatch_on_stages_with_experts():
    two = _durations(2)
    for kind in (ActionKind.F.name, ActionKind.B.name):
        assert two[(1, 1, kind, 0)] == two[(0, 1, kind, 0)]  # replica 1's light mb waits for 'a'
        assert two[(1, 1, kind, 1)] == two[(0, 1, kind, 1)]  # 'b' and 'd': equal anyway
    assert two[(0, 0, "F", 0)] == two[(1, 0, "F", 0)]  # the encoder: same images, nothing to wait for
    one = _durations(1)
    assert one[(1, 1, "F", 0)] < one[(0, 1, "F", 0)]  # without expert parallelism: on its own
    assert two[(1, 1, "F", 0)] > one[(0, 1, "F", 0)]  # the heavy one's time plus its all-to-all


def test_only_the_replicas_of_one_group_wait_for_each_other():
    four = _durations(2, dp=4)  # groups {0, 1} and {2, 3}; replica 2 holds the heaviest microbatch
    assert four[(1, 1, "F", 0)] == four[(0, 1, "F", 0)] < four[(2, 1, "F", 0)] == four[(3, 1, "F", 0)]


def _spans(
    ep: int, images: dict[str, tuple[int, int]]
) -> dict[tuple[int, int, str, int], tuple[float, float]]:
    """(replica, stage, kind, mb) -> simulated (start, end) at DP 2, ``images`` replacing samples' images."""
    reps = [(("a",), ("b",)), (("c",), ("d",))]
    it = IterationAssignment(tuple(ReplicaAssignment(2, r, r, (0, 1)) for r in reps))
    plan = generate_plan("1f1b", _layout(ep), [it], _samples(images), tiny_moe_cost())
    (run,) = simulate_plan(plan, tiny_moe_cost(), trace_iterations=1)
    return {
        (plan.layout.replica_of(s.rank)[0], s.action.stage, s.action.kind.name, s.action.mb): (
            s.start_ms,
            s.end_ms,
        )
        for r in run.replicas
        for s in r.spans
    }


def test_an_ep_group_starts_each_action_with_experts_when_its_last_replica_can():
    slow = {"c": (896, 896)}  # replica 1's first image is 16x larger: its LLM input comes later
    one, two = _spans(1, slow), _spans(2, slow)
    assert one[(0, 1, "F", 0)][0] < one[(1, 1, "F", 0)][0]  # ep 1: each replica starts on its own input
    for kind in ("F", "B"):
        for mb in (0, 1):
            assert two[(0, 1, kind, mb)] == two[(1, 1, kind, mb)]  # the group's replicas meet
    assert two[(0, 1, "F", 0)][0] == one[(1, 1, "F", 0)][0]  # when replica 1's input arrived
    assert two[(0, 0, "F", 1)][0] < two[(1, 0, "F", 1)][0]  # the encoders do not wait for each other


def _traced(ep: int) -> TracedRun:
    """A hand-made trace at DP 2: the LLM forward of mb 0 runs 0-100 ms on replica 0 ('a', heavy) and
    40-100 ms on replica 1 ('c', its input came 40 ms later); the encoders' forwards 0-30 ms."""
    reps = [(("a",), ("b",)), (("c",), ("d",))]
    it = IterationAssignment(tuple(ReplicaAssignment(2, r, r, (0, 1)) for r in reps))
    plan = generate_plan("1f1b", _layout(ep), [it], _samples(), tiny_moe_cost())
    layout = plan.layout

    def event(replica: int, stage: int, start_ms: float, end_ms: float) -> dict:
        args = {"step": 0, "kind": "F", "stage": stage, "mb": 0, "sub": 0}
        return {"ph": "X", "cat": "compute", "pid": layout.global_rank(replica, stage), "ts": start_ms * 1e3,
                "dur": (end_ms - start_ms) * 1e3, "args": args}  # fmt: skip

    events = [event(0, 0, 0, 30), event(1, 0, 0, 30), event(1, 1, 40, 100), event(0, 1, 0, 100)]
    return TracedRun("run", plan, events, tiny_moe_cost(), 1, [], {})


def test_the_refit_measures_an_ep_groups_action_from_its_last_start_on_its_heaviest_samples():
    rows = sorted((stage, ids, ms) for stage, _, ids, _, ms in traced_computes(_traced(2)))
    # the LLM: replica 0's 40 ms wait is not its compute; the group's action is priced on 'a' (heavier)
    assert rows == [(0, ("a",), 30.0), (0, ("c",), 30.0), (1, ("a",), 60.0), (1, ("a",), 60.0)]
    alone = sorted((stage, ids, ms) for stage, _, ids, _, ms in traced_computes(_traced(1)))
    assert alone == [
        (0, ("a",), 30.0),
        (0, ("c",), 30.0),
        (1, ("a",), 100.0),
        (1, ("c",), 60.0),
    ]  # ep 1: as traced
