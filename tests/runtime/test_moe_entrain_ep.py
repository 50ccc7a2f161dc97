"""Entrain's own plans train with expert parallelism: on the tiny Qwen3-VL-MoE checkpoint's batch,
Entrain's assignment over 2 replicas picks ``K_eff`` 2 and 3, so the plan at ``--ep 2`` runs its EP
group on the least (2) with one LLM program (``tests/core/test_entrain_ep_groups.py``) while each
replica keeps its own encoder microbatches and deferrals. On 4 forked gloo ranks (encoder | LLM, 2
replicas) in float64, eager forward, and again with ramped fill/drain and split weight gradients,
the step's loss (auxiliary term included), gradient norm and every gradient before and after
clipping equal transformers' single-process step at rel 1e-5."""

from __future__ import annotations

from dataclasses import replace

from entrain.core.assignment.hierarchical import assign_entrain
from entrain.core.planning.setups import ConfigRequest, fixed_stage_setup
from entrain.runtime.planning import make_plan

from . import test_expert_parallel as ep_tests
from . import test_qwen3_vl_moe_train as moe_train
from .cases import batch_metas, works
from .harness import run_workers

fm, oracle = moe_train.fm, moe_train.oracle
"""The tiny Qwen3-VL-MoE checkpoint and transformers' fp64 step of its batch (module fixtures)."""

DP, K = 2, 4


def entrain_plan(fm, ep: int, options: dict | None = None):
    """Entrain's plan of the batch on one encoder and one LLM stage, ``DP`` replicas, ``ep`` on the LLM."""
    batch = works(list(fm.metas.values()), fm.cost)
    u = len(batch) // (DP * K)
    req = ConfigRequest("skewed", "tiny", 0, DP, 1, len(batch), u, entrain_layout="disjoint", entrain_ramp=0,
                        entrain_split=False)  # fmt: skip
    layout = fixed_stage_setup("entrain", req, fm.cost, [w.meta for w in batch], 1, 1).layout
    llm = replace(layout.components["llm"], ep=ep)
    layout = replace(layout, components={**layout.components, "llm": llm})
    return make_plan("entrain", layout, [batch], fm.cost, options)


def _train_all(env, fm, plans, eps=(2,)):
    return [ep_tests._train_ep(env, fm, plan, ep) for plan in plans for ep in eps]


def _actions(plan, replica: int, rank: int):
    return plan.iterations[0].actions[plan.layout.global_rank(replica, rank)]


def test_entrain_plans_at_ep2_match_transformers(fm, oracle, tmp_path):
    batch = works(list(fm.metas.values()), fm.cost)
    assert [r.k_eff for r in assign_entrain(batch, DP, K).replicas] == [2, 3]  # the replicas would differ
    plans = [entrain_plan(fm, 2), entrain_plan(fm, 2, {"ramp_microbatches": 1, "split_weight_grads": True})]
    for plan in plans:
        assert [r.k_eff for r in plan.iterations[0].assignment.replicas] == [2, 2]
    assert len(_actions(plans[1], 0, 1)) > len(_actions(plans[0], 0, 1))  # ramped: more LLM pieces
    results = run_workers(_train_all, 4, tmp_path, fm, plans, timeout_s=180)
    for i, name in enumerate(("entrain-ep2", "entrain-ep2-ramp-split")):
        ep_tests._assert_oracle([r[i] for r in results], oracle, name)


def test_replicas_with_other_encoder_programs_train_at_ep2_as_at_ep1(fm, tmp_path):
    """Another draw of the batch (seed 3): ``K_eff`` 2 and 3 again, and after the group's count the two
    replicas defer differently, so their encoder ranks' programs and their LLM ranks' receives differ
    (only their LLM computations agree, which is what the runtime checks): the step at ``--ep 2``
    equals the same plan's at ``--ep 1``."""
    from .harness import ReferenceStep, assert_matches_reference

    metas = {m.id: replace(m, vision=next(iter(fm.metas.values())).vision) for m in batch_metas(8, 3)}
    fm = replace(fm, metas=metas)
    batch = works(list(metas.values()), fm.cost)
    assert [r.k_eff for r in assign_entrain(batch, DP, K).replicas] == [2, 3]
    plan = entrain_plan(fm, 2)
    assert [r.k_eff for r in plan.iterations[0].assignment.replicas] == [2, 2]
    assert all(_actions(plan, 0, r) != _actions(plan, 1, r) for r in (0, 1))
    results = run_workers(_train_all, 4, tmp_path, fm, [plan], (2, 1), timeout_s=180)
    at2, at1 = [r[0] for r in results], [r[1] for r in results]

    def merged(rs, i):
        return {k: v for r in rs for k, v in r[i].items()}

    ref = ReferenceStep(merged(at1, 0), merged(at1, 1), at1[0][3], at1[0][2])
    assert_matches_reference(
        "seed3-ep2-vs-ep1", before=merged(at2, 0), after=merged(at2, 1), loss=at2[0][2], grad_norm=at2[0][3],
        ref=ref, tol=1e-5,
    )  # fmt: skip
