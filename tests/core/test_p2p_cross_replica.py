"""Point-to-point programs of plans that move encoder work across data-parallel replicas
(``encoder-rebalance``): the last encoder stage's message is cut into a piece per owning replica, each
sent to that replica's first LLM stage and its gradient sent back, on channels between replicas that
the warm-up connects; the NCCL replay checks every rank together."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest

from entrain.core.errors import ScheduleError
from entrain.core.ir.p2p import (
    Comm,
    encoder_pieces,
    layout_channels,
    rank_program,
    receiver_orders,
    replica_programs,
)
from entrain.core.ir.p2p_check import check_iteration, check_plan, check_program
from entrain.core.ir.plan import ActionKind
from entrain.core.systems import SYSTEMS, moves_across_replicas
from tests.runtime.cases import batch_metas, plan_for, works


@cache
def _plan():
    return plan_for("encoder-rebalance", 1, 1, 2, 2, works(batch_metas()))


def _peers(program, kind: ActionKind) -> dict[tuple[int, int], set[int]]:
    return {(c.action.mb, c.action.sub_index): {op.peer for b in c.batches for op in b.ops}
            for c in program if isinstance(c, Comm) and c.action.kind is kind}  # fmt: skip


def test_the_registry_names_the_systems_that_move_encoder_work_across_replicas():
    assert [s for s in SYSTEMS if moves_across_replicas(s)] == ["encoder-rebalance"]
    assert moves_across_replicas("entrain", {"encoder_rebalance": True})
    assert not moves_across_replicas("disttrain", {"encoder_rebalance": True})  # a baseline takes no option
    assert not moves_across_replicas("entrain", {"encoder_rebalance": "off"})


def test_a_moved_samples_features_go_to_its_owner_and_its_gradient_back():
    plan = _plan()
    it = plan.iterations[0]
    pieces = encoder_pieces(plan.layout, it)
    assert pieces and all(r in per for (r, _, _), per in pieces.items())  # the own piece comes first
    assert layout_channels(plan.layout) == [(0, 1), (1, 0), (2, 3), (3, 2)]
    assert layout_channels(plan.layout, cross_replica=True) == [(0, 1), (0, 3), (1, 0), (1, 2), (2, 1), (2, 3),
                                                                (3, 0), (3, 2)]  # fmt: skip
    programs = {g: rank_program(plan.layout, it, g) for g in range(4)}
    for (r, mb, sub), per in pieces.items():
        enc, own_llm = 2 * r, 2 * r + 1
        owners = {2 * o + 1 for o in per}
        assert _peers(programs[enc], ActionKind.SEND_F)[(mb, sub)] == owners
        assert _peers(programs[enc], ActionKind.RECV_B)[(mb, sub)] == owners
        for o in per:
            if o != r:
                assert enc in _peers(programs[2 * o + 1], ActionKind.RECV_F)[(mb, sub)]
                assert enc in _peers(programs[2 * o + 1], ActionKind.SEND_B)[(mb, sub)]
        assert own_llm in owners


def test_the_replay_needs_the_channels_between_replicas():
    plan = _plan()
    check_plan(plan, cross_replica=True)
    with pytest.raises(ScheduleError, match="no channels between replicas"):
        check_plan(plan)


def test_a_receiver_that_ignores_the_pieces_deadlocks_in_the_replay():
    """Planted: the first LLM ranks receive only their own replica's messages; the pieces' sends
    never complete."""
    plan = _plan()
    it = plan.iterations[0]
    programs = {g: rank_program(plan.layout, it, g, cross_replica=True, warmup=True) for g in range(4)}

    def own_only(g, step):
        if not isinstance(step, Comm) or step.action.kind is not ActionKind.RECV_F:
            return step
        return replace(step, batches=tuple(b for b in step.batches if b.group == (g - 1, g)))

    for g in (1, 3):
        programs[g] = tuple(own_only(g, s) for s in programs[g])
    with pytest.raises(ScheduleError, match="deadlock"):
        check_program(programs)


def test_a_piece_its_owner_takes_before_it_arrives_is_named():
    """Planted: the owner's LLM forward of the microbatch runs before the receive of the piece."""
    plan = _plan()
    it = plan.iterations[0]
    (r, mb, sub), per = next(iter(encoder_pieces(plan.layout, it).items()))
    owner = 2 * next(o for o in per if o != r) + 1
    acts = list(it.actions[owner])
    recv = next(i for i, a in enumerate(acts) if a.kind is ActionKind.RECV_F and a.mb == mb)
    fwd = next(i for i, a in enumerate(acts) if a.kind is ActionKind.F and a.mb == mb)
    acts[recv], acts[fwd] = acts[fwd], acts[recv]
    broken = replace(it, actions={**it.actions, owner: tuple(acts)})
    with pytest.raises(ScheduleError, match="runs before it arrives"):
        check_iteration(plan.layout, broken, cross_replica=True)


@pytest.mark.parametrize("system", ["encoder-rebalance", "entrain", "dip"])
def test_one_pass_channel_orders_build_each_ranks_own_program(system):
    """``receiver_orders`` (every receiver at once) gives each rank the program it builds alone: where
    pieces cross replicas (over every rank) and where each replica keeps its own; ``replica_programs``
    (one replica's ranks at once) too, with pieces or without."""
    plan = _plan() if system == "encoder-rebalance" else plan_for(system, 2, 2, 2, 3, works(batch_metas()))
    layout = plan.layout
    for it in plan.iterations:
        pieces = encoder_pieces(layout, it)
        assert bool(pieces) == (system == "encoder-rebalance")
        alone = {g: rank_program(layout, it, g) for g in range(layout.world_size)}
        orders = receiver_orders(layout, it, range(layout.world_size), False, pieces)
        together = {g: rank_program(layout, it, g, pieces=pieces, orders=orders[g]) for g in alone}
        assert together == alone
        per_replica = {g: p for r in range(layout.dp) for g, p in replica_programs(layout, it, r).items()}
        assert per_replica == alone
        assert any(isinstance(step, Comm) for program in alone.values() for step in program)
