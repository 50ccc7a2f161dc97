"""Entrain with expert parallelism runs each replica's deferral pairs in the slots of the group's
reference replica's pairs of the same rank (``_ReplicaSearch._aligned``): the group's LLM stages run in
lockstep, so its heavy microbatches meet at one position. On random batches, every replica of a group
ranks its executed pairs by predicted LLM time in the same slot order as the others."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.assignment.hierarchical import assign_entrain
from entrain.core.ir.plan import ActionKind
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.systems import generate_plan

from .test_entrain_ep_groups import IMAGES, _batch, _cost, _layout


def _slot_ranks(plan, cost, replica: int) -> tuple[int, ...] | None:
    """The replica's pair slots, heaviest pair (LLM forward + backward ms) first; None on a tie."""
    costs = PlanCosts(plan.layout, cost, plan.samples)
    llm = [s.stage for s in plan.layout.stages if s.component == "llm"]
    rep = plan.iterations[0].assignment.replicas[replica]

    def ms(mb: int) -> float:
        ids = rep.llm_microbatches[mb]
        return sum(costs.compute_ms(s, k, ids) for s in llm for k in (ActionKind.F, ActionKind.B))

    order = rep.execution_order
    w = [ms(order[i]) + ms(order[i + 1]) for i in range(0, len(order) - len(order) % 2, 2)]
    if len(set(w)) < len(w):
        return None
    return tuple(sorted(range(len(w)), key=lambda i: -w[i]))


@settings(deadline=None, max_examples=20)
@given(
    images=st.lists(st.lists(st.integers(0, len(IMAGES) - 1), max_size=2), min_size=32, max_size=32),
    text=st.lists(st.integers(4, 600), min_size=32, max_size=32),
    options=st.sampled_from([{}, {"assignment": "auto"}, {"split_weight_grads": True}]),
)
def test_a_groups_replicas_run_their_pairs_in_one_rank_order(images, text, options):
    cost = _cost()
    batch = _batch(images, text, 32, cost)
    samples = {s.id: s for s in batch}
    plan = generate_plan(
        "entrain", _layout(4, 4, 4, 2), [assign_entrain(batch, 4, 4)], samples, cost, options
    )
    ranks = [_slot_ranks(plan, cost, r) for r in range(4)]
    known = {r for r in ranks if r is not None and len(r) > 1}
    assert len(known) <= 1, ranks
