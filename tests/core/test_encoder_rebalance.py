"""The ``encoder-rebalance`` baseline's batcher (``assignment.batchers.rebalance``) and Entrain's
``encoder_rebalance`` option on a generated Plan (``schedules.rebalance``)."""

from __future__ import annotations

from collections import Counter

from entrain.core.assignment.batchers.disttrain import assign_disttrain
from entrain.core.assignment.batchers.rebalance import (
    assign_encoder_rebalance,
    moved_samples,
    rebalance_encoder,
)
from entrain.core.ir.validate import validate_plan
from entrain.core.schedules.rebalance import rebalance_plan
from entrain.core.systems import ENCODER_REBALANCE, ENTRAIN, generate_plan, plan_system
from entrain.core.workload.work import SampleWork
from tests.sim.fixtures import deferral_assignment, disjoint_layout, one_iteration, raw_samples, toy_cost


def _skewed(n: int = 16) -> list[SampleWork]:
    """Encoder and LLM work anti-correlated: a replica owning the LLM-light samples is encoder-heavy."""
    return [SampleWork(f"s{i:02d}", float(1 + (i % 8) ** 2), float(1 + (7 - i % 8) * 3)) for i in range(n)]


def _loads(groups, key: str) -> list[float]:
    return [sum(getattr(s, key) for s in g) for g in groups]


def test_rebalance_lowers_the_heaviest_encoder_and_keeps_an_own_sample():
    owners = [[SampleWork("a", 10.0, 1.0), SampleWork("b", 9.0, 1.0)], [SampleWork("c", 1.0, 1.0)]]
    enc = rebalance_encoder(owners)
    assert max(_loads(enc, "encoder")) == 10.0  # b moved: 10 | 9 + 1
    assert sorted(s.id for g in enc for s in g) == ["a", "b", "c"]
    assert all({s.id for s in e} & {s.id for s in o} for e, o in zip(enc, owners))
    # a single own sample never leaves its replica, however heavy
    lone = rebalance_encoder([[SampleWork("x", 50.0, 1.0)], [SampleWork("y", 1.0, 1.0)]])
    assert [[s.id for s in g] for g in lone] == [["x"], ["y"]]


def test_assignment_balances_each_module_and_keeps_owners_whole():
    batch = _skewed()
    dp, k = 2, 2
    got = assign_encoder_rebalance(batch, dp, k)
    base = assign_disttrain(batch, dp, k)
    work = {s.id: s for s in batch}
    assert len({rep.execution_order for rep in got.replicas}) == 1  # the all-to-all: one order
    for m in range(k):
        owned = [rep.llm_microbatches[m] for rep in got.replicas]
        computed = [rep.encoder_microbatches[m] for rep in got.replicas]
        assert [len(o) for o in owned] == [4, 4]  # DistTrain's U per replica
        assert Counter(s for o in owned for s in o) == Counter(s for c in computed for s in c)
        enc = [sum(work[s].encoder for s in c) for c in computed]
        base_enc = [sum(work[s].encoder for s in rep.encoder_microbatches[m]) for rep in base.replicas]
        assert max(enc) <= max(base_enc)
        llm = [sum(work[s].llm for s in o) for o in owned]
        base_llm = [sum(work[s].llm for s in rep.llm_microbatches[m]) for rep in base.replicas]
        assert max(llm) <= max(base_llm)
    moved = moved_samples(got)
    assert moved and all(e != o for e, o in moved.values())


def test_system_plans_validate_and_cross_replicas():
    batch = _skewed()
    layout = disjoint_layout(2, 2, dp=2, k=2, microbatch_size=4)
    plan = plan_system(ENCODER_REBALANCE, layout, [batch], toy_cost())
    validate_plan(plan)
    assert moved_samples(plan.iterations[0].assignment)


def test_entrain_option_moves_encoder_work_and_keeps_every_action():
    samples = raw_samples({f"{r}{i}": (8.0 if r == "a" else 1.0, 2.0) for r in "ab" for i in range(4)})
    reps = [deferral_assignment([[f"{r}0", f"{r}1"], [f"{r}2", f"{r}3"]], {}) for r in "ab"]
    layout = disjoint_layout(2, 2, dp=2, k=2, microbatch_size=2)
    plain = generate_plan(ENTRAIN, layout, one_iteration(*reps), samples, toy_cost())
    got = generate_plan(
        ENTRAIN, layout, one_iteration(*reps), samples, toy_cost(), {"encoder_rebalance": True}
    )
    validate_plan(got)
    assert got.options["encoder_rebalance"] is True
    assert got.iterations[0].actions == plain.iterations[0].actions
    it = got.iterations[0]
    for pos in range(2):
        enc = [sum(samples[s].encoder for s in rep[pos].encoder_subs[0]) for rep in it.microbatches]
        assert max(enc) < 16.0  # was 16 | 2
        assert [rep[pos].llm_ids for rep in it.microbatches] == [
            rep[pos].llm_ids for rep in plain.iterations[0].microbatches
        ]
    assert rebalance_plan(rebalance_plan(plain)).iterations == got.iterations  # a fixed point


def test_a_real_run_plans_encoder_work_moved_across_replicas():
    """``make_plan`` checks the point-to-point programs with the channels between replicas (the
    registry's ``cross_replica_moves``); one replica moves nothing."""
    from entrain.core.ir.p2p import encoder_pieces
    from entrain.runtime.planning import make_plan

    batch = _skewed()
    two = make_plan(
        ENCODER_REBALANCE, disjoint_layout(2, 2, dp=2, k=2, microbatch_size=4), [batch], toy_cost()
    )
    assert moved_samples(two.iterations[0].assignment) and encoder_pieces(two.layout, two.iterations[0])
    one = make_plan(
        ENCODER_REBALANCE, disjoint_layout(2, 2, dp=1, k=4, microbatch_size=4), [batch], toy_cost()
    )
    assert not moved_samples(one.iterations[0].assignment)


def test_rebalancing_never_raises_a_replicas_in_flight_encoder_work():
    """Replica a is heavy at position 0 and light at 1, b the reverse: balancing either position alone
    would give one replica more encoder work over the two in flight (window 2) than any replica had,
    so the memory the plan was fitted to would not hold; with a window of 1 both positions balance."""
    from entrain.core.schedules.rebalance import rebalance_iteration

    works = {"a0": 4.0, "a1": 4.0, "a2": 1.0, "b0": 1.0, "b1": 4.0, "b2": 4.0}
    samples = raw_samples({s: (w, 1.0) for s, w in works.items()})
    reps = [deferral_assignment([["a0", "a1"], ["a2"]], {}), deferral_assignment([["b0"], ["b1", "b2"]], {})]
    layout = disjoint_layout(2, 2, dp=2, k=2, microbatch_size=2)
    plain = generate_plan(ENTRAIN, layout, one_iteration(*reps), samples, toy_cost()).iterations[0]
    assert rebalance_iteration(plain, samples, window=2).microbatches == plain.microbatches
    moved = rebalance_iteration(plain, samples, window=1)
    assert [sum(works[s] for s in rep[0].encoder_ids) for rep in moved.microbatches] == [4.0, 5.0]
