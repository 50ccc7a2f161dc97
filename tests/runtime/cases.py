"""Shared fixtures of the runtime tests: a skewed 8-sample batch of the tiny model, plans per system."""

from __future__ import annotations

import random

from entrain.core.costs.presets import build_cost_model
from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.plan import Plan
from entrain.core.planning.setups import ConfigRequest, fixed_stage_setup
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.schedules.memory_split import backward_rooms
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork
from entrain.runtime.planning import make_plan

SEED = 0
MAX_GRAD_NORM = 0.05


def batch_metas(n: int = 8, seed: int = 0) -> list[SampleMeta]:
    """Small images and skewed text lengths: enough imbalance for Entrain to defer samples."""
    rng = random.Random(seed)
    return [
        SampleMeta(
            f"s{i}",
            ((rng.choice([56, 84, 112, 168]), rng.choice([56, 84, 112])),),
            rng.choice([16, 24, 40, 90, 160]),
        )
        for i in range(n)
    ]


def text_only_metas() -> list[SampleMeta]:
    """``batch_metas`` with sample s3 turned text-only: an encoder microbatch with nothing to encode."""
    metas = batch_metas()
    metas[3] = SampleMeta("s3", (), 30)
    return metas


def works(metas: list[SampleMeta], cost=None) -> list[SampleWork]:
    """Each sample's work under ``cost`` (default: the tiny model's on ``cpu-tiny``)."""
    cost = cost or build_cost_model("tiny", "cpu-tiny")
    return [cost.sample_work(m) for m in metas]


def plan_for(
    system: str,
    encoder_stages: int,
    llm_stages: int,
    dp: int,
    num_microbatches: int,
    batch: list[SampleWork],
    options: dict | None = None,
    cost=None,
):
    """``system``'s Plan of ``batch`` with the stage counts fixed (Algorithm 2's layer partition), with
    the schedule ``options`` (default: Entrain's extensions off); ``cost``: another model's cost model
    (default: the tiny model's)."""
    cost = cost or build_cost_model("tiny", "cpu-tiny")
    u = len(batch) // (dp * num_microbatches)
    req = ConfigRequest("skewed", "tiny", 0, dp, 1, len(batch), u, entrain_layout="disjoint", entrain_ramp=0,
                        entrain_split=False)  # fmt: skip
    setup = fixed_stage_setup(system, req, cost, [w.meta for w in batch], encoder_stages, llm_stages)
    return make_plan(system, setup.layout, [batch], cost, options)


def one_sample_budget_bytes(plan: Plan) -> float:
    """The smallest memory budget at which every single sample's recomputation transient fits on an
    uncut ``plan`` of the tiny model with one encoder stage (rank 0): its model state + the largest,
    over encoder backwards, of what the rank holds when the backward starts + the sub's largest
    one-sample transient. Entrain's memory split then cuts the sub(s) where that is reached."""
    costs = PlanCosts(plan.layout, build_cost_model("tiny", "cpu-tiny"), plan.samples)
    it = plan.iterations[0]
    graph = ReplicaGraph(plan.layout, it.microbatches[0])
    compute = {r: [a for a in acts if a.kind.is_compute] for r, acts in it.actions.items()}
    rooms = backward_rooms(graph, costs, compute, [0.0] * len(compute))
    need = max(
        -room + max(costs.recompute_transient_bytes(s, (sid,)) for sid in graph.ids(s, m, u))
        for (s, m, u), room in rooms.items()
        if graph.ids(s, m, u)
    )
    return costs.model_state_bytes(0) + need
