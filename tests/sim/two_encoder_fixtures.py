"""A hand-made plan with two encoder pipelines (vision on rank 0, audio on rank 1) feeding one LLM
stage (rank 2), and its costs: raw-work samples with each encoder's work, toy linear cost models
(forward 1/3 and backward 2/3 of a stage's work, 0.5 ms per message)."""

from __future__ import annotations

from dataclasses import dataclass

from entrain.core.ir.microbatches import IterationAssignment
from entrain.core.ir.plan import (
    Action,
    ComponentLayout,
    IterationPlan,
    Layout,
    MicrobatchSpec,
    Plan,
    StageSpec,
)
from entrain.core.schedules.encoder_costs import EncodersPlanCosts
from entrain.core.workload.work import SampleWork
from tests.sim.fixtures import plain_assignment, toy_cost

LATENCY_MS = 0.5

# id: ((vision, audio), llm) forward + backward work; forward = work / 3, backward = 2 work / 3
WORK = {"a": ((3.0, 9.0), 6.0), "b": ((6.0, 3.0), 3.0)}

ACTIONS = {
    0: "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
    1: "1F0 1SEND_F0 1F1 1SEND_F1 1RECV_B0 1B0 1RECV_B1 1B1",
    2: "2RECV_F0 2F0 2B0 2SEND_B0 2RECV_F1 2F1 2B1 2SEND_B1",
}

# Hand-computed (F = w/3, B = 2w/3, each message 0.5 ms):
#   vision F0 [0, 1] -> 1.5;  F1 [1, 3] -> 3.5
#   audio  F0 [0, 3] -> 3.5;  F1 [3, 4] -> 4.5
#   LLM    RECV_F0 waits for both: 3.5; F0 [3.5, 5.5]; B0 [5.5, 9.5] -> grads at 10.0
#          RECV_F1 9.5 (both arrived); F1 [9.5, 10.5]; B1 [10.5, 12.5] -> grads at 13.0
#   vision B0 [10, 12]; B1 [13, 17]
#   audio  B0 [10, 16]; B1 [16, 18]
EXPECTED_MS = 18.0
EXPECTED_ENDS = {0: 17.0, 1: 18.0, 2: 12.5}


@dataclass(frozen=True)
class ToyEncoder:
    """``planning.encoders.Encoder``'s three fields (raw-work samples: no units read)."""

    name: str
    cost: object
    units: object = staticmethod(lambda meta: ())


def layout() -> Layout:
    stages = (
        StageSpec(0, "encoder", 0, 1, 0, encoder="vision"),
        StageSpec(1, "encoder", 0, 1, 1, encoder="audio"),
        StageSpec(2, "llm", 0, 1, 2),
    )
    comps = {"vision": ComponentLayout(), "audio": ComponentLayout(), "llm": ComponentLayout()}
    return Layout(1, 1, 2, comps, stages)


def samples() -> dict[str, SampleWork]:
    return {sid: SampleWork(sid, sum(enc), llm, None, enc) for sid, (enc, llm) in WORK.items()}


def plan(actions: dict[int, str] = ACTIONS) -> Plan:
    rep = plain_assignment([["a"], ["b"]])
    specs = (MicrobatchSpec(0, 0, (("a",),), (("a",),)), MicrobatchSpec(1, 1, (("b",),), (("b",),)))
    acts = {g: tuple(Action.parse(t) for t in text.split()) for g, text in actions.items()}
    it = IterationPlan(IterationAssignment((rep,)), (specs,), acts)
    return Plan("hand", layout(), (it,), samples())


def encoders() -> tuple[ToyEncoder, ToyEncoder]:
    cost = toy_cost(enc_layers=1, llm_layers=1, act_bytes_per_token=0.0, latency_ms=LATENCY_MS)
    return ToyEncoder("vision", cost), ToyEncoder("audio", cost)


def costs(p: Plan | None = None) -> EncodersPlanCosts:
    p = plan() if p is None else p
    return EncodersPlanCosts(p.layout, encoders(), p.samples)
