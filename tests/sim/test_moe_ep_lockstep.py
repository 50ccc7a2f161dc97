"""The simulator runs an expert-parallel group's replicas in lockstep on their stages with experts:
with ``ep`` 2 the replica holding the light microbatch waits for the heavy one's at every sparse
layer, so each LLM action lasts the longer of the two; the encoder's do not wait, nor does anything
with ``ep`` 1 (every replica on its own, as before)."""

from __future__ import annotations

from entrain.core.costs.costmodel import (
    ComponentCost,
    CostModel,
    ExpertCost,
    HardwareSpec,
    LayerCost,
    Quadratic,
)
from entrain.core.ir.microbatches import IterationAssignment, ReplicaAssignment
from entrain.core.ir.plan import ActionKind, ComponentLayout, Layout, StageSpec
from entrain.core.systems import generate_plan
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork
from entrain.sim.executor import simulate_plan

KEY = "tp1cp1"


def _cost() -> CostModel:
    def layer(name, experts=None):
        q = Quadratic(0.0, 0.01, 0.1)
        return LayerCost(
            name, "decoder_layer", {KEY: q}, {KEY: q.scaled(2.0)}, param_bytes=1000.0, experts=experts
        )

    x = ExpertCost(num_experts=8, top_k=2, fraction=0.5, a2a_bytes_per_token=512.0, param_bytes=800.0)
    hw = HardwareSpec("hand", allreduce_bandwidth_bytes_per_ms=1e6, allreduce_latency_ms=0.05)
    return CostModel(
        "hand",
        hw,
        ComponentCost("encoder", (layer("blocks.0"),)),
        ComponentCost("llm", (layer("layers.0", x),)),
    )


def _layout(ep: int, dp: int = 2) -> Layout:
    return Layout(
        dp=dp,
        microbatch_size=1,
        num_microbatches=2,
        components={"encoder": ComponentLayout(), "llm": ComponentLayout(ep=ep)},
        stages=(StageSpec(0, "encoder", 0, 1, 0), StageSpec(1, "llm", 0, 1, 1)),
    )


def _samples() -> dict[str, SampleWork]:
    # replica 0's first microbatch is heavy on the LLM; e..h: the other EP group at DP 4 (e heavier still)
    text = {"a": 2000, "b": 100, "c": 100, "d": 100, "e": 4000, "f": 100, "g": 100, "h": 100}
    metas = [SampleMeta(s, ((224, 224),), t) for s, t in text.items()]
    return {m.id: SampleWork(m.id, 0.0, 0.0, m) for m in metas}


def _durations(ep: int, dp: int = 2) -> dict[tuple[int, int, str, int], float]:
    """(replica, stage, kind, mb) -> simulated duration."""
    reps = [(("a",), ("b",)), (("c",), ("d",)), (("e",), ("f",)), (("g",), ("h",))][:dp]
    it = IterationAssignment(tuple(ReplicaAssignment(2, r, r, (0, 1)) for r in reps))
    plan = generate_plan("1f1b", _layout(ep, dp), [it], _samples(), _cost())
    (run,) = simulate_plan(plan, _cost(), trace_iterations=1)
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
