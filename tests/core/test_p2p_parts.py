"""Point-to-point programs of messages with several named parts (``StageSpec.parts``): every part has
its own header and data operation, a send posts every header then every data, a forward receive
every header then every data, and the NCCL replay pairs operations by (message, header/data, part)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from entrain.core.errors import ScheduleError
from entrain.core.ir.graph import Message
from entrain.core.ir.p2p import Comm, message_part_names, rank_program, replica_programs
from entrain.core.ir.p2p_check import check_iteration, check_program
from entrain.core.ir.plan import Action, ComponentLayout, IterationPlan, Layout, MicrobatchSpec, StageSpec
from entrain.core.model.layer_specs import MessagePart

DEEP = (MessagePart("deep_0", 8), MessagePart("deep_1", 8))


def _layout() -> Layout:
    """Encoder on rank 0, two LLM stages on ranks 1 and 2; the encoder's message carries two parts
    besides ``hidden``, the first LLM stage's one (``deep_1`` rides on to the last stage)."""
    stages = (
        StageSpec(0, "encoder", 0, 2, 0, parts=DEEP),
        StageSpec(1, "llm", 0, 1, 1, parts=DEEP[1:]),
        StageSpec(2, "llm", 1, 3, 2),
    )
    return Layout(1, 1, 2, {"encoder": ComponentLayout(), "llm": ComponentLayout(pp=2)}, stages)


def _iteration() -> IterationPlan:
    mbs = tuple(MicrobatchSpec(m, m, ((f"s{m}",),), ((f"s{m}",),)) for m in range(2))
    acts = {
        0: "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
        1: "1RECV_F0 1F0 1SEND_F0 1RECV_F1 1F1 1SEND_F1 1RECV_B0 1B0 1SEND_B0 1RECV_B1 1B1 1SEND_B1",
        2: "2RECV_F0 2F0 2B0 2SEND_B0 2RECV_F1 2F1 2B1 2SEND_B1",
    }
    return IterationPlan(
        None, (mbs,), {r: tuple(Action.parse(a) for a in t.split()) for r, t in acts.items()}
    )


def _comm(rank: int, text: str) -> Comm:
    (step,) = [
        s
        for s in rank_program(_layout(), _iteration(), rank)
        if isinstance(s, Comm) and str(s.action) == text
    ]
    return step


def _ops(c: Comm) -> list[list[str]]:
    return [[f"{op.part}:{op.tensor}" for op in b.ops] for b in c.batches]


def test_every_part_has_its_header_and_data_in_wire_order():
    layout = _layout()
    assert message_part_names(layout, Message("F", 0, 1, 0, 0)) == ("hidden", "deep_0", "deep_1")
    assert message_part_names(layout, Message("B", 2, 1, 0, 0)) == ("hidden", "deep_1")
    names = ["hidden", "deep_0", "deep_1"]
    assert _ops(_comm(0, "0SEND_F0")) == [[f"header:{n}" for n in names] + [f"data:{n}" for n in names]]
    assert _ops(_comm(1, "1RECV_F0")) == [[f"header:{n}" for n in names], [f"data:{n}" for n in names]]
    grads = ["hidden", "deep_1"]  # a gradient's shapes are known: one batch
    assert _ops(_comm(1, "1RECV_B0")) == [[f"header:{n}" for n in grads] + [f"data:{n}" for n in grads]]
    assert _ops(_comm(2, "2SEND_B0")) == [[f"header:{n}" for n in grads] + [f"data:{n}" for n in grads]]


def test_a_multi_part_plan_is_deadlock_free_under_nccl():
    check_iteration(_layout(), _iteration())
    check_iteration(_layout(), _iteration(), forward_only=True)


def test_a_receive_that_drops_one_part_is_a_mismatch():
    """Planted: rank 1 does not receive ``deep_0`` of the encoder's messages; the sender's operations
    then pair with the wrong receives and the replay names the pair."""
    programs = dict(replica_programs(_layout(), _iteration(), 0))

    def drop(step):
        if not isinstance(step, Comm) or step.action.kind.name != "RECV_F" or step.action.stage != 1:
            return step
        keep = tuple(replace(b, ops=tuple(op for op in b.ops if op.tensor != "deep_0")) for b in step.batches)
        return replace(step, batches=keep)

    programs[1] = tuple(drop(s) for s in programs[1])
    with pytest.raises(
        ScheduleError, match=r"1RECV_F0\.0\[deep_1\]:header<-r0 would be matched with 0SEND_F0\.0\[deep_0\]"
    ):
        check_program(programs)
