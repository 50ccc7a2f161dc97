"""The planner's count of point-to-point messages in flight (``entrain.core.costs.memory``): a sent
message until its receive has provably been posted, a received one until the compute action that
takes it, on a hand-built schedule whose every step is worked out below."""

from __future__ import annotations

import pytest

from entrain.core.costs.memory import (
    in_flight_message_bytes,
    peak_in_flight_message_bytes,
    plan_message_bytes,
)
from entrain.core.errors import ScheduleError
from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.plan import Action, ComponentLayout, IterationPlan, Layout, MicrobatchSpec, StageSpec
from entrain.core.schedules.action_costs import PlanCosts

SIZES = {0: 100.0, 1: 10.0}  # bytes of microbatch m's activations (its gradient: the same)


def _size(sender: int, receiver: int, msg) -> float:
    return SIZES[msg.mb]


def _layout(ranks: int) -> Layout:
    stages = (StageSpec(0, "encoder", 0, 2, 0), StageSpec(1, "llm", 0, 2, ranks - 1))
    return Layout(
        1, 1, 2, {"encoder": ComponentLayout(pp=1), "llm": ComponentLayout(pp=ranks - 1 or 1)}, stages
    )


def _iteration(acts: dict[int, str]) -> IterationPlan:
    mbs = tuple(MicrobatchSpec(m, m, ((f"s{m}",),), ((f"s{m}",),)) for m in range(2))
    return IterationPlan(
        None, (mbs,), {r: tuple(Action.parse(a) for a in t.split()) for r, t in acts.items()}
    )


def test_messages_in_flight_per_step_of_a_hand_built_schedule():
    """Rank 0 sends mb 0 then mb 1; rank 1 takes mb 1 first, so it receives both at its first step
    (FIFO channel order) and holds mb 0's activations until its forward at step 5. Rank 0's sends
    complete when rank 1 receives them, which rank 0 learns at its step 4 (the gradient of mb 1,
    sent after rank 1's receive); rank 1 never learns that its gradients arrived: held to the end."""
    it = _iteration({
        0: "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B1 0B1 0RECV_B0 0B0",
        1: "1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F0 1F0 1B0 1SEND_B0",
    })  # fmt: skip
    held = in_flight_message_bytes(_layout(2), it, _size)
    assert held[0] == [0, 100, 100, 110, 10, 0, 100, 0]
    assert held[1] == [110, 100, 100, 110, 110, 10, 10, 110]
    assert peak_in_flight_message_bytes(_layout(2), it, _size) == {0: 110, 1: 110}


def test_a_hand_over_on_one_rank_holds_nothing():
    it = _iteration({0: "0F0 0SEND_F0 1RECV_F0 1F0 1B0 1SEND_B0 0RECV_B0 0B0"})
    assert in_flight_message_bytes(_layout(1), it, _size) == {0: [0.0] * 8}


def test_a_real_plans_messages_in_flight_stay_within_its_messages():
    """A 1F1B 1+1 plan of the tiny model: each rank holds something at its peak, never more than all
    the messages it sends and receives together, and the forward-only step holds no gradient."""
    from entrain.core.costs.presets import build_cost_model
    from entrain.core.ir.validate import message_of
    from tests.runtime.cases import batch_metas, plan_for, works

    cost = build_cost_model("tiny", "cpu-tiny")
    plan = plan_for("1f1b", 1, 1, 1, 4, works(batch_metas(4), cost))
    it = plan.iterations[0]
    costs, graph = PlanCosts(plan.layout, cost, plan.samples), ReplicaGraph(plan.layout, it.microbatches[0])
    size = plan_message_bytes(costs, it)
    fwd = next(a for a in it.actions[0] if a.kind.name == "SEND_F")
    assert size(0, 1, message_of(fwd)) == costs.message_bytes(0, graph.ids(0, fwd.mb, fwd.sub_index)) > 0

    peaks = peak_in_flight_message_bytes(plan.layout, it, size)
    for rank, acts in it.actions.items():
        total = sum(size(rank, 1 - rank, message_of(a)) for a in acts if not a.kind.is_compute)
        assert 0 < peaks[rank] <= total
    forward = peak_in_flight_message_bytes(plan.layout, it, size, forward_only=True)
    sends = [size(0, 1, message_of(a)) for a in it.actions[0] if a.kind.name == "SEND_F"]
    largest = max(sends)
    assert 0 < forward[1] <= sum(sends)
    assert forward[0] >= largest


def test_a_piece_that_crosses_replicas_counts_its_own_samples():
    """encoder-rebalance at DP 2: the last encoder rank's message to another replica is the piece of
    the samples that replica owns, and its own replica's message the rest."""
    from entrain.core.costs.presets import build_cost_model
    from entrain.core.ir.graph import Message
    from entrain.core.ir.p2p import encoder_pieces
    from tests.runtime.cases import batch_metas, plan_for, works

    cost = build_cost_model("tiny", "cpu-tiny")
    plan = plan_for("encoder-rebalance", 1, 1, 2, 2, works(batch_metas(), cost))
    it = plan.iterations[0]
    costs = PlanCosts(plan.layout, cost, plan.samples)
    size = plan_message_bytes(costs, it)
    (r, mb, sub), per = next(iter(encoder_pieces(plan.layout, it).items()))
    msg = Message("F", 0, 1, mb, sub)
    whole = costs.message_bytes(0, it.microbatches[r][mb].encoder_subs[sub])
    parts = [size(2 * r, 2 * o + 1, msg) for o in per]
    assert abs(sum(parts) - whole) < 1e-6 * whole and all(0 <= p < whole for p in parts)
    grads = [size(2 * o + 1, 2 * r, Message("B", 1, 0, mb, sub)) for o in per]
    assert grads == parts
    assert all(v >= 0 for v in peak_in_flight_message_bytes(plan.layout, it, size).values())


def test_replicas_of_one_shape_hold_the_same_on_their_own_ranks():
    """Replicas whose action lists are the same share one computed shape (cached), each on its own
    ranks and with its own message sizes; a rank of another replica holds nothing of them."""
    from entrain.core.costs.presets import build_cost_model
    from tests.runtime.cases import batch_metas, plan_for, works

    cost = build_cost_model("tiny", "cpu-tiny")
    plan = plan_for("1f1b", 1, 1, 2, 2, works(batch_metas(4), cost))
    it = plan.iterations[0]
    assert it.actions[0] == it.actions[2] and it.actions[1] == it.actions[3]
    held = in_flight_message_bytes(plan.layout, it, _size)
    assert held[0] == held[2] and held[1] == held[3] and max(held[2]) > 0
    only = in_flight_message_bytes(plan.layout, it, lambda s, r, m: 7.0 if s >= 2 else 0.0)  # replica 1's
    assert max(only[0]) == max(only[1]) == 0 and max(only[2]) > 0 and max(only[3]) > 0


def test_without_pieces_each_replica_counts_its_own_messages_alone():
    """``pieces={}`` (the memory check's count where pieces cannot be sent): no message crosses
    replicas; with the iteration's pieces the moved samples' pieces do."""
    from entrain.core.costs.presets import build_cost_model
    from tests.runtime.cases import batch_metas, plan_for, works

    cost = build_cost_model("tiny", "cpu-tiny")
    plan = plan_for("encoder-rebalance", 1, 1, 2, 2, works(batch_metas(), cost))
    it = plan.iterations[0]

    def crossing(src: int, dst: int, msg) -> float:
        return 1.0 if src // 2 != dst // 2 else 0.0

    local = in_flight_message_bytes(plan.layout, it, crossing, pieces={})
    assert set(local) == {0, 1, 2, 3} and max(map(max, local.values())) == 0
    assert max(map(max, in_flight_message_bytes(plan.layout, it, crossing).values())) > 0


def test_a_sender_learns_of_a_receive_through_a_third_rank():
    """A looped placement (encoder stages on ranks 0 and 1, LLM stages on ranks 2 and 0): rank 0's
    message to rank 1 completes when rank 0 learns of rank 1's receive, which it does at its step 2,
    through rank 2's message (sent after rank 2 heard from rank 1), not only at step 6 from rank 1."""
    stages = (
        StageSpec(0, "encoder", 0, 1, 0),
        StageSpec(1, "encoder", 1, 2, 1),
        StageSpec(2, "llm", 0, 1, 2),
        StageSpec(3, "llm", 1, 2, 0),
    )
    layout = Layout(1, 1, 1, {"encoder": ComponentLayout(pp=2), "llm": ComponentLayout(pp=2)}, stages)
    mbs = (MicrobatchSpec(0, 0, (("s0",),), (("s0",),)),)
    acts = {
        0: "0F0 0SEND_F0 3RECV_F0 3F0 3B0 3SEND_B0 0RECV_B0 0B0",
        1: "1RECV_F0 1F0 1SEND_F0 1RECV_B0 1B0 1SEND_B0",
        2: "2RECV_F0 2F0 2SEND_F0 2RECV_B0 2B0 2SEND_B0",
    }
    it = IterationPlan(None, (mbs,), {r: tuple(Action.parse(a) for a in t.split()) for r, t in acts.items()})
    held = in_flight_message_bytes(layout, it, _size)
    assert held[0] == [0, 100, 100, 0, 0, 100, 100, 0]
    assert held[1] == [100, 0, 100, 100, 0, 100]
    assert held[2] == [100, 0, 100, 100, 0, 100]


def test_a_schedule_whose_ranks_wait_on_each_other_is_refused():
    it = _iteration({0: "0F0 0RECV_B0 0SEND_F0 0B0", 1: "1RECV_F0 1F0 1B0 1SEND_B0"})
    with pytest.raises(ScheduleError, match=r"ranks \[0, 1\] wait for messages that are never sent"):
        in_flight_message_bytes(_layout(2), it, _size)
