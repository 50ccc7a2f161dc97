"""Point-to-point programs under the two NCCL behaviours the first GPU run meets beyond the
rendezvous: lazy connection setup (a pair's first operation blocks the host until the peer posts on
it too) and, with ``CUDA_DEVICE_MAX_CONNECTIONS=1``, one hardware queue per GPU. Every system's real
Plans pass under lazy connection because the program opens with the channel warm-up; under one
queue a system passes or the run is refused before launch."""

from __future__ import annotations

from functools import cache

import pytest

from entrain.core.errors import ConfigError, ScheduleError
from entrain.core.ir.graph import Message
from entrain.core.ir.p2p import Batch, Comm, P2POp, WarmUp, rank_program, replica_programs, warmup_batches
from entrain.core.ir.p2p_check import REAL_NCCL, NcclRules, check_plan, check_program, rules_from_env
from entrain.core.ir.plan import Action
from entrain.core.systems import SYSTEMS, moves_across_replicas
from entrain.runtime.preflight import SHARED_QUEUE_SAFE, refuse_shared_gpu_queue
from tests.runtime.cases import batch_metas, plan_for, works

SHARED = NcclRules(lazy_connect=True, shared_queue=True)

DISJOINT = [(1, 1, 1), (1, 1, 2), (1, 2, 1), (2, 1, 2), (2, 2, 1), (1, 2, 2), (2, 2, 2), (3, 3, 1), (4, 4, 1)]
"""(encoder stages, LLM stages, dp): 2 to 8 ranks."""
COLOCATED = [(1, 1, 2), (2, 2, 1), (2, 2, 2), (3, 3, 1), (3, 3, 2), (4, 4, 1), (4, 4, 2)]
"""(stages per component, the same, dp): 2 to 8 ranks, rank r holding both components' stage r."""


def _layouts(system: str) -> list[tuple[int, int, int]]:
    return COLOCATED if SYSTEMS[system].colocated else DISJOINT


@cache
def _plan(system: str, enc: int, llm: int, dp: int, seed: int = 0):
    mbs = 2 if SYSTEMS[system].colocated else 4
    return plan_for(system, enc, llm, dp, mbs, works(batch_metas(8 * dp, seed=seed)))


def _check_without_warmup(plan, rules: NcclRules) -> None:
    for i, it in enumerate(plan.iterations):
        for forward_only in (False, True):
            for replica in range(plan.layout.dp):
                programs = replica_programs(plan.layout, it, replica, forward_only=forward_only)
                check_program(programs, i, rules)


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_every_systems_real_plans_pass_under_lazy_connection(system):
    for enc, llm, dp in _layouts(system):
        plan = _plan(system, enc, llm, dp)  # the default rules: lazy connection, warm-up first
        check_plan(plan, cross_replica=moves_across_replicas(system, plan.options))


@pytest.mark.parametrize("enc", [3, 4])
def test_without_the_warm_up_dip_deadlocks_connecting_in_step_0(enc):
    """Rank 0's first send to the last rank blocks its host until that rank posts on the channel; it
    waits for a header from the rank before it, ..., rank 1 for a forward rank 0 sends after its
    blocked send."""
    plan = _plan("dip", enc, enc, 1)
    with pytest.raises(ScheduleError) as err:
        _check_without_warmup(plan, REAL_NCCL)
    text = str(err.value)
    assert "iteration 0: deadlock" in text and "a pair connects on its first operations" in text
    last = enc - 1  # the rank of the last encoder stage, the first LLM stage's on rank 0 sends back to
    assert f"blocks its host connecting to rank {last} on channel (0, {last})" in text
    _check_without_warmup(plan, NcclRules())  # connected in advance: the same program is fine


def test_the_warm_up_is_one_operation_per_channel_in_one_global_order():
    plan = _plan("dip", 3, 3, 1)
    seen = {}
    for rank in range(3):
        (head, *_) = rank_program(plan.layout, plan.iterations[0], rank, warmup=True)
        assert isinstance(head, WarmUp) and head.batches == warmup_batches(plan.layout, rank)
        for b in head.batches:
            (op,) = b.ops
            assert op.part == "warmup" and rank in b.group and op.send == (rank == b.group[0])
            seen.setdefault(b.group, []).append(rank)
        groups = [b.group for b in head.batches]
        assert groups == sorted(groups)
    assert all(len(ranks) == 2 for ranks in seen.values()) and len(seen) == 6


def _hand_program():
    """Rank 0's first operation is a send to rank 2; rank 2 first waits for rank 1, rank 1 for rank 0."""
    a, b = Message("F", 0, 1, 0, 0), Message("F", 1, 2, 0, 0)
    late = Message("F", 0, 2, 1, 0)

    def comm(step: int, group, op: P2POp) -> Comm:
        act = op.message.send_action() if op.send else op.message.recv_action()
        return Comm(act, step, (Batch(group, (op,)),))

    return {
        0: (comm(0, (0, 2), P2POp(True, 2, late)), comm(1, (0, 1), P2POp(True, 1, a))),
        1: (comm(0, (0, 1), P2POp(False, 0, a)), comm(1, (1, 2), P2POp(True, 2, b))),
        2: (comm(0, (1, 2), P2POp(False, 1, b)), comm(1, (0, 2), P2POp(False, 0, late))),
    }


def test_a_first_send_blocks_the_host_until_the_peer_posts_on_the_pair():
    programs = _hand_program()
    check_program(programs)  # connected in advance: rank 0's sends do not hold its host
    with pytest.raises(
        ScheduleError, match=r"rank 0 step 0 \(0SEND_F1.0\) blocks its host connecting to rank 2"
    ):
        check_program(programs, rules=REAL_NCCL)
    warm = {0: [((0, 1), True, 1), ((0, 2), True, 2)], 1: [((0, 1), False, 0), ((1, 2), True, 2)]}
    warm[2] = [((0, 2), False, 0), ((1, 2), False, 1)]
    w = Message("W", -1, -1, 0, 0)
    for g, ops in warm.items():
        head = WarmUp(tuple(Batch(grp, (P2POp(s, p, w, "warmup"),)) for grp, s, p in ops))
        programs[g] = (head, *programs[g])
    check_program(programs, rules=REAL_NCCL)  # warmed up in one global order: no host blocks mid-step


def test_one_gpu_queue_holds_a_rank_behind_its_waiting_send():
    """entrain 1+1: with one queue per GPU, rank 0's gradient receive waits behind a forward send
    that waits behind another; rank 1's forward receive behind its gradient sends."""
    plan = _plan("entrain", 1, 1, 1)
    check_plan(plan)
    with pytest.raises(ScheduleError) as err:
        check_plan(plan, SHARED)
    text = str(err.value)
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1: one queue per GPU" in text
    assert "is queued on its GPU's one queue behind" in text and "queued on its communicator behind" in text


def _passes_shared(system: str) -> list[bool]:
    out = []
    for enc, llm, dp in _layouts(system):
        try:
            check_plan(_plan(system, enc, llm, dp), SHARED, moves_across_replicas(system))
            out.append(True)
        except ScheduleError:
            out.append(False)
    return out


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_under_one_gpu_queue_a_system_passes_or_is_refused_before_launch(system):
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    passes = _passes_shared(system)
    if system in SHARED_QUEUE_SAFE:
        assert all(passes)
        refuse_shared_gpu_queue([system], env)
    else:
        assert not all(passes)  # the list of safe systems is no wider than it must be
        with pytest.raises(ConfigError) as err:
            refuse_shared_gpu_queue([system], env)
        line = str(err.value)
        assert "\n" not in line and "CUDA_DEVICE_MAX_CONNECTIONS=1" in line and system in line
        assert all(s in line for s in SHARED_QUEUE_SAFE)
    refuse_shared_gpu_queue([system], env, device="cpu")  # gloo on the CPU: no GPU queue
    refuse_shared_gpu_queue([system], {"CUDA_DEVICE_MAX_CONNECTIONS": "8"})
    refuse_shared_gpu_queue([system], {})


def test_rules_from_the_environment():
    assert rules_from_env({}) == REAL_NCCL
    assert rules_from_env({"CUDA_DEVICE_MAX_CONNECTIONS": " 1"}) == SHARED
    assert rules_from_env({"CUDA_DEVICE_MAX_CONNECTIONS": "32"}) == REAL_NCCL


def test_the_launcher_refuses_one_gpu_queue_before_any_process(monkeypatch):
    """``check_before_launch`` runs the refusal (the run folder and dataset checks come first)."""
    from entrain.runtime import preflight

    calls = []
    monkeypatch.setattr(preflight, "check_run_folder", lambda spec, overwrite: None)
    monkeypatch.setattr(preflight, "check_dataset_size", lambda spec: None)
    monkeypatch.setattr(
        preflight, "refuse_shared_gpu_queue", lambda systems, device: calls.append((list(systems), device))
    )

    class Spec:
        class run:
            resume = False
            device = "cuda"

        class schedule:
            systems = ("entrain", "1f1b")

    preflight.check_before_launch(Spec, overwrite=False, fixed=False)
    assert calls == [(["entrain", "1f1b"], "cuda")]


def test_a_warm_up_step_names_itself_in_errors():
    w = Message("W", -1, -1, 0, 0)
    programs = {
        0: (Action.parse("0F0"),),  # never connects
        1: (WarmUp((Batch((0, 1), (P2POp(False, 0, w, "warmup"),)),)), Action.parse("1F0")),
    }
    with pytest.raises(
        ScheduleError, match=r"rank 1 the warm-up blocks its host connecting to rank 0 on channel \(0, 1\)"
    ):
        check_program(programs, rules=REAL_NCCL)
