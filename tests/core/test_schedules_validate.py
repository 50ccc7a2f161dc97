"""The Plan validator reports broken Plans as a grid naming rank and step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from entrain.core.errors import ScheduleError
from entrain.core.ir.plan import Action, Plan
from entrain.core.ir.validate import validate_plan
from entrain.core.systems import generate_plan
from tests.sim.fixtures import deferral_assignment, disjoint_layout, one_iteration, raw_samples, toy_cost


def _plan(system: str = "1f1b") -> Plan:
    cost = toy_cost()
    samples = raw_samples({s: (2.0, 3.0) for s in "abcdef"})
    groups = [["a", "b"], ["c"], ["d", "e"], ["f"]]
    deferred = {"b": (0, 1)} if system.startswith("entrain") else {}
    return generate_plan(
        system,
        disjoint_layout(2, 2, k=4),
        one_iteration(deferral_assignment(groups, deferred)),
        samples,
        cost,
    )


def _edit(plan: Plan, rank: int, fn) -> Plan:
    it = plan.iterations[0]
    actions = dict(it.actions)
    actions[rank] = tuple(fn(list(actions[rank])))
    return replace(plan, iterations=(replace(it, actions=actions),))


def _acts(text: str) -> list[Action]:
    return [Action.parse(a) for a in text.split()]


@pytest.mark.parametrize("system", ["1f1b", "entrain", "entrain-1f1b", "disttrain"])
def test_generated_plans_validate_and_round_trip(system):
    plan = _plan(system)
    validate_plan(plan)
    again = Plan.loads(plan.dumps())
    assert again.iterations[0].actions == plan.iterations[0].actions
    validate_plan(again)


def test_missing_backward_names_rank_and_marks_grid():
    plan = _edit(_plan(), 1, lambda acts: [a for a in acts if str(a) != "1B2"])
    with pytest.raises(ScheduleError) as err:
        validate_plan(plan)
    msg = str(err.value)
    assert "rank 1" in msg and "1B2" in msg and "missing" in msg
    assert "<-- ERROR HERE" in msg
    assert msg.count("\nrank ") == 4  # one row per rank


def test_duplicate_forward():
    plan = _edit(_plan(), 0, lambda acts: acts + _acts("0F1"))
    with pytest.raises(ScheduleError, match=r"rank 0 step \d+: 0F1 runs twice"):
        validate_plan(plan)


def test_backward_before_forward():
    def swap(acts):
        i, j = acts.index(Action.parse("3F0")), acts.index(Action.parse("3B0"))
        acts[i], acts[j] = acts[j], acts[i]
        return acts

    with pytest.raises(ScheduleError, match=r"rank 3 step \d+: backward of 3F?0 before its forward"):
        validate_plan(_edit(_plan(), 3, swap))


def test_stage_on_the_wrong_rank():
    plan = _edit(_plan(), 0, lambda acts: acts + _acts("1F0"))
    with pytest.raises(ScheduleError, match="held by pp rank 1, not 0"):
        validate_plan(plan)


def test_unpaired_receive():
    plan = _edit(_plan(), 1, lambda acts: [a for a in acts if str(a) != "1RECV_F2"])
    with pytest.raises(ScheduleError, match=r"1RECV_F2 is missing"):
        validate_plan(plan)


def test_extra_send_with_no_such_message():
    plan = _edit(_plan(), 3, lambda acts: acts + _acts("3SEND_F0"))
    with pytest.raises(ScheduleError, match="no such message"):
        validate_plan(plan)


def test_deadlock_is_reported_with_every_blocked_rank():
    # rank 1 waits for gradients of microbatch 0 before forwarding microbatch 1 -> classic 1F1B hang
    def early_recv(acts):
        acts.remove(Action.parse("1RECV_B0"))
        acts.insert(0, Action.parse("1RECV_B0"))
        return acts

    with pytest.raises(ScheduleError) as err:
        validate_plan(_edit(_plan(), 1, early_recv))
    msg = str(err.value)
    assert "deadlock" in msg and "rank 1 step 0 (1RECV_B0) waits for its SEND (2SEND_B0)" in msg
    assert "[1RECV_B0]" in msg and "<-- ERROR HERE" in msg
