"""Point-to-point programs replayed under NCCL's semantics: every system, layout and extension is
deadlock-free as the runtime issues it; the order a one-communicator runtime used deadlocks; FIFO
matching is respected."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.errors import ScheduleError
from entrain.core.ir.graph import Message
from entrain.core.ir.p2p import (
    Batch,
    Comm,
    P2POp,
    layout_channels,
    rank_program,
    replica_programs,
    single_group,
)
from entrain.core.ir.p2p_check import check_plan, check_program
from entrain.core.ir.plan import Action, ComponentLayout, IterationPlan, Layout, MicrobatchSpec, StageSpec
from entrain.core.ir.validate import validate_plan
from entrain.core.systems import SYSTEMS, generate_plan
from tests.runtime.cases import batch_metas, plan_for, works
from tests.sim.fixtures import (
    colocated_layout,
    deferral_assignment,
    draw_grouped_work,
    one_iteration,
    plain_assignment,
    raw_samples,
    split,
    toy_cost,
)


def _chain_layout(enc_pp: int, llm_pp: int, shared: bool, k: int, dp: int = 1) -> Layout:
    stages = [StageSpec(i, "encoder", a, b, i) for i, (a, b) in enumerate(split(6, enc_pp))]
    first = enc_pp - 1 if shared else enc_pp
    stages += [StageSpec(enc_pp + j, "llm", a, b, first + j) for j, (a, b) in enumerate(split(6, llm_pp))]
    comps = {"encoder": ComponentLayout(pp=enc_pp), "llm": ComponentLayout(pp=llm_pp)}
    return Layout(dp, 1, k, comps, tuple(stages))


def _is_entrain(system: str) -> bool:
    return system.startswith("entrain")


def _is_colocated(system: str) -> bool:
    return system.startswith("dip")


@st.composite
def _cases(draw, system: str):
    groups, work, deferred = draw_grouped_work(draw, st, max_mbs=7, max_per_mb=4, min_mbs=2)
    k = len(groups)
    if _is_colocated(system):
        layout = colocated_layout(draw(st.integers(1, 3)), k=k)
    else:
        shared = _is_entrain(system) and draw(st.booleans())
        layout = _chain_layout(draw(st.integers(1, 3)), draw(st.integers(1, 3)), shared, k)
    options = {}
    if _is_entrain(system):
        options = {
            "ramp_microbatches": draw(st.sampled_from([0, 1, 2, "auto"])),
            "split_weight_grads": draw(st.booleans()),
        }
        asg = deferral_assignment(groups, deferred)
    else:
        asg = plain_assignment(groups)
    return layout, one_iteration(asg), raw_samples(work), options


@pytest.mark.parametrize("system", sorted(SYSTEMS))
@settings(max_examples=40)
@given(data=st.data())
def test_every_system_and_layout_is_deadlock_free_under_nccl(system, data):
    layout, asg, samples, options = data.draw(_cases(system))
    cost = toy_cost(enc_layers=6, llm_layers=6, call_ms=0.1, out_bytes_per_token=1e5)
    plan = generate_plan(system, layout, asg, samples, cost, options)
    validate_plan(plan)
    check_plan(plan)


def _real(system: str, enc: int, llm: int, dp: int, seed: int, options=None):
    metas = batch_metas(8 * dp, seed=seed)
    return plan_for(system, enc, llm, dp, 4 if not _is_colocated(system) else 2, works(metas), options)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    "system,enc,llm,options",
    [
        ("entrain", 1, 2, None),
        ("entrain", 2, 2, {"split_weight_grads": True}),
        ("entrain", 1, 3, {"ramp_microbatches": "auto"}),
        ("entrain", 1, 2, {"assignment": "auto"}),
        ("entrain-1f1b", 1, 2, None),
        ("1f1b", 1, 2, None),
        ("1f1b", 2, 2, None),
        ("disttrain", 1, 2, None),
        ("dip", 2, 2, None),
        ("dip-greedy", 2, 2, None),
        ("dip-greedy-mem", 2, 2, None),
    ],
)
def test_the_tiny_models_plans_are_deadlock_free_under_nccl(system, enc, llm, options, seed):
    plan = _real(system, enc, llm, 2, seed, options)
    check_plan(plan)


def test_one_communicator_deadlocks_1f1b_with_the_error_grid():
    """The order the runtime used before (one group, one stream): rank 1's ``1RECV_B0`` waits behind
    its ``1SEND_F1`` while rank 2's ``2RECV_F1`` waits behind its ``2SEND_B0``."""
    plan = _real("1f1b", 1, 2, 1, 0)
    programs = replica_programs(plan.layout, plan.iterations[0], 0)
    check_program(programs)  # per-channel groups: fine
    with pytest.raises(ScheduleError) as err:
        check_program(single_group(programs))
    text = str(err.value)
    assert "deadlock under NCCL semantics" in text and "<-- ERROR HERE" in text
    assert "1RECV_B0" in text and "queued on its communicator behind" in text
    assert text.count("\nrank ") == 3


def _two_rank_layout() -> Layout:
    stages = (StageSpec(0, "encoder", 0, 2, 0), StageSpec(1, "llm", 0, 2, 1))
    return Layout(1, 1, 2, {"encoder": ComponentLayout(pp=1), "llm": ComponentLayout(pp=1)}, stages)


def _out_of_order_iteration() -> IterationPlan:
    """Rank 0 sends mb 0 then mb 1; rank 1 consumes mb 1 first (sound with buffered sends)."""
    mbs = tuple(MicrobatchSpec(m, m, ((f"s{m}",),), ((f"s{m}",),)) for m in range(2))
    acts = {
        0: "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B1 0B1 0RECV_B0 0B0",
        1: "1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F0 1F0 1B0 1SEND_B0",
    }
    return IterationPlan(
        None, (mbs,), {r: tuple(Action.parse(a) for a in t.split()) for r, t in acts.items()}
    )


def test_receives_follow_the_senders_order_per_channel():
    layout, it = _two_rank_layout(), _out_of_order_iteration()
    prog = rank_program(layout, it, 1)
    first, later = (s for s in prog if isinstance(s, Comm) and s.action.kind.name == "RECV_F")
    received = [op.message.mb for b in first.batches for op in b.ops if op.part == "data"]
    assert received == [0, 1]  # mb 0 first: FIFO matching cannot deliver mb 1 before it
    assert later.batches == ()  # already received, kept for its action
    grads = [s for s in rank_program(layout, it, 0) if isinstance(s, Comm) and s.action.kind.name == "RECV_B"]
    assert all(len(c.batches) == 1 and len(c.batches[0].ops) == 2 for c in grads)  # sized: one batch
    check_program(replica_programs(layout, it, 0))


def test_a_receive_out_of_channel_order_is_named():
    """Planted: rank 1 receives mb 1 before mb 0 on the same channel."""
    layout, it = _two_rank_layout(), _out_of_order_iteration()
    programs = dict(replica_programs(layout, it, 0))

    def naive(step):
        if not isinstance(step, Comm) or step.action.kind.name != "RECV_F":
            return step
        msg = Message("F", 0, 1, step.action.mb, 0)
        ops = (P2POp(False, 0, msg, "header"),), (P2POp(False, 0, msg, "data"),)
        return replace(step, batches=tuple(Batch((0, 1), o) for o in ops))

    programs[1] = tuple(naive(s) for s in programs[1])
    with pytest.raises(ScheduleError, match=r"would be matched with 0SEND_F0.0:header"):
        check_program(programs)


def test_channels_of_a_layout():
    layout = _chain_layout(1, 2, shared=True, k=2, dp=2)  # ranks 0-1 per replica; stage 1 shares rank 0
    assert layout_channels(layout) == [(0, 1), (1, 0), (2, 3), (3, 2)]


def test_a_forward_receive_reads_its_header_before_posting_the_data():
    """Activations have a size only their sender knows: the receiver posts the header alone, reads
    it, then posts the data receive; a gradient (the shape of its forward output) posts both at once."""
    layout, it = _two_rank_layout(), _out_of_order_iteration()
    forward = [s for s in rank_program(layout, it, 1) if isinstance(s, Comm) and s.batches]
    (recv,) = [c for c in forward if c.action.kind.name == "RECV_F"]
    assert [[op.part for op in b.ops] for b in recv.batches] == [["header"], ["data"]] * 2
    assert all(b.receives for b in recv.batches)  # the host waits for each: the size comes first
    sends = [c for c in forward if c.action.kind.name == "SEND_B"]
    assert all([op.part for op in c.batches[0].ops] == ["header", "data"] for c in sends)


def test_a_data_receive_posted_before_its_header_is_a_mismatch():
    """Planted: rank 1 posts the data receive of a forward message before its header; FIFO matching
    would pair it with the sender's header, so the checker names the pair."""
    layout, it = _two_rank_layout(), _out_of_order_iteration()
    programs = dict(replica_programs(layout, it, 0))

    def swapped(step):
        if not isinstance(step, Comm) or step.action.kind.name != "RECV_F" or not step.batches:
            return step
        batches = list(step.batches)
        batches[0], batches[1] = batches[1], batches[0]  # mb 0's data, then its header
        return replace(step, batches=tuple(batches))

    programs[1] = tuple(swapped(s) for s in programs[1])
    with pytest.raises(ScheduleError, match=r"1RECV_F0\.0:data<-r0 would be matched with 0SEND_F0\.0:header"):
        check_program(programs)


@pytest.mark.parametrize("system", ["1f1b", "dip", "entrain"])
def test_forward_receives_sized_by_the_receiver_post_one_batch_and_stay_deadlock_free(system):
    """A forward message whose shape the receiver knows (``known_shape``) posts its headers and data
    as one batch, as a gradient does; every rank's program stays deadlock-free under lazy connection
    and under one shared GPU queue."""
    from entrain.core.ir.p2p_check import NcclRules

    plan = _real(system, 2, 2, 1, 0)
    it = plan.iterations[0]
    programs = {
        g: rank_program(plan.layout, it, g, warmup=True, known_shape=lambda m: True) for g in range(4)
    }
    receives = [c for steps in programs.values() for c in steps if isinstance(c, Comm)
                and c.action.kind.name == "RECV_F" and c.batches]  # fmt: skip
    assert receives and all(
        all({op.part for op in b.ops} == {"header", "data"} for b in c.batches) for c in receives
    )
    for rules in (NcclRules(lazy_connect=True), NcclRules(lazy_connect=True, shared_queue=True)):
        if system == "1f1b" or not rules.shared_queue:
            check_program(programs, rules=rules)
