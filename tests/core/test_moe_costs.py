"""Mixture-of-experts pricing: the routing model's busiest expert, the busiest rank of an
expert-parallel group, the all-to-all, the experts' memory sharded by ``ep``, and the simulator's
prices of a stage with experts, each against numbers computed by hand (docs/design.md,
"Mixture-of-experts costs"). Dense layers price exactly as before."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from entrain.core.costs.costmodel import ComponentCost, CostModel, ExpertCost
from entrain.core.costs.layer_costs import uniform_router_imbalance
from entrain.core.costs.memory import ADAM_BYTES_PER_BF16_WEIGHT_BYTE, MicrobatchLoad, stage_memory_bytes
from entrain.core.ir.plan import ActionKind, ComponentLayout, Layout, StageSpec
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork
from tests.moe_fixtures import EXPERTS, tiny_moe_cost


def _cost(experts: ExpertCost | None = EXPERTS) -> CostModel:
    """One encoder layer and one LLM layer of 1000 parameter bytes, 800 of them experts'; forward
    0.01 ms a token + 0.1 ms a call, backward 0.02 + 0.2."""
    return tiny_moe_cost(experts=experts, activation=10.0)


# z_8 = Phi^-1((8 - 0.375) / 8.25) = 1.43420 (Blom's expected largest of 8 standard normals)
Z8 = 1.434203


def test_uniform_router_imbalance_hand_numbers():
    # 128 experts, top-8, 1000 tokens: z_128 = 2.58469, std / mean = sqrt(15/16 * 128 / 8000) = 0.122474
    assert uniform_router_imbalance(1000, 128, 8) == pytest.approx(1 + 2.58469 * 0.122474, rel=1e-5)
    # 8 experts, top-2, 128 tokens: sqrt(3/4 * 8 / 256) = 0.153093
    assert uniform_router_imbalance(128, 8, 2) == pytest.approx(1 + Z8 * 0.153093, rel=1e-5)
    assert uniform_router_imbalance(0, 8, 2) == 1.0
    assert uniform_router_imbalance(100, 8, 8) == 1.0  # every expert picked by every token
    assert uniform_router_imbalance(1, 128, 8) == 128 / 8  # one token: its experts hold 1, the mean 1/16


@pytest.mark.parametrize("experts,top_k,tokens", [(8, 2, 64), (16, 2, 500), (128, 8, 1000)])
def test_uniform_router_imbalance_matches_sampled_routing(experts, top_k, tokens):
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(200):
        picks = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k]
        counts = np.bincount(picks.ravel(), minlength=experts)
        ratios.append(counts.max() / counts.mean())
    assert uniform_router_imbalance(tokens, experts, top_k) == pytest.approx(float(np.mean(ratios)), rel=0.03)


def test_busiest_rank_factor_hand_numbers():
    f = 1 + Z8 * 0.153093  # 2 ranks of 64 tokens route 128
    assert EXPERTS.busiest_expert_factor(128) == pytest.approx(f, rel=1e-5)
    # ep 2: 4 experts a rank, the busiest expert's rank has 3 more at the mean of the other 7
    rho = (f + 3 * (8 - f) / 7) / 4
    assert EXPERTS.rank_load_factor(64, 2) == pytest.approx(rho, rel=1e-6)
    assert EXPERTS.rank_load_factor(64, 1) == 1.0  # one rank runs every expert: all n * k tokens
    # ep = E: one expert a rank, the busiest rank is the busiest expert (8 ranks route 512 tokens)
    assert EXPERTS.rank_load_factor(64, 8) == pytest.approx(EXPERTS.busiest_expert_factor(512))
    skewed = dataclasses.replace(EXPERTS, skew=1.5)
    assert skewed.busiest_expert_factor(128) == pytest.approx(1.5 * f, rel=1e-6)


def test_expert_ms_hand_numbers():
    cost = _cost()
    rho = (1 + Z8 * 0.153093 + 3 * (8 - (1 + Z8 * 0.153093)) / 7) / 4
    busy_fwd = 0.5 * 0.01 * 64 * (rho - 1)
    a2a = 0.05 + 512 * 64 * (1 / 2) / 1e6  # latency + dispatch and combine bytes leaving the rank
    assert cost.expert_ms("llm", 0, 64, "fwd", ep=2) == pytest.approx(busy_fwd + a2a, rel=1e-6)
    assert cost.expert_ms("llm", 0, 64, "bwd", ep=2) == pytest.approx(2 * busy_fwd + a2a, rel=1e-6)
    # full recomputation re-runs the forward's experts and all-to-all in the backward (a component's
    # first layer keeps its activations and re-runs nothing)
    two = dataclasses.replace(cost, llm=ComponentCost("llm", (cost.encoder.layers[0], cost.llm.layers[0])))
    full = two.expert_ms("llm", 1, 64, "bwd", ep=2, recompute="full")
    assert full == pytest.approx(3 * busy_fwd + 2 * a2a, rel=1e-6)
    assert cost.expert_ms("llm", 0, 64, "bwd", ep=2, recompute="full") == pytest.approx(2 * busy_fwd + a2a)
    assert two.expert_ms("llm", 1, 64, "bwd_input", ep=2) == pytest.approx(2 * 0.5 * busy_fwd + a2a)
    assert cost.expert_ms("llm", 0, 64, "fwd", ep=1) == 0.0  # balanced on one rank: layer_ms's price
    assert cost.expert_ms("encoder", 0, 64, "fwd", ep=2) == 0.0  # a dense layer
    assert cost.expert_ms("llm", 0, 0, "fwd", ep=2) == 0.0


def test_experts_sharded_by_ep_in_memory():
    cost = _cost()
    layer = cost.llm.layers[0]
    assert layer.rank_param_bytes(1) == 1000.0
    assert layer.rank_param_bytes(1, ep=4) == pytest.approx(200 + 800 / 4)
    assert layer.rank_param_bytes(2, ep=4) == pytest.approx((200 + 800 / 4) / 2)
    assert cost.encoder.layers[0].rank_param_bytes(1, ep=4) == 1000.0  # dense: ep shards nothing
    load = MicrobatchLoad(100.0, 0.0, 100.0, 0.0)
    mem = stage_memory_bytes(cost, "llm", 0, 1, 1, 1, load, 2, "none", 4)
    assert mem == pytest.approx(400 * ADAM_BYTES_PER_BF16_WEIGHT_BYTE + 2 * 100 * 10.0)
    assert stage_memory_bytes(cost, "llm", 0, 1, 1, 1, load, 2, "none") == pytest.approx(
        1000 * ADAM_BYTES_PER_BF16_WEIGHT_BYTE + 2 * 100 * 10.0
    )


def _layout(ep: int) -> Layout:
    return Layout(
        dp=4,
        microbatch_size=1,
        num_microbatches=2,
        components={"encoder": ComponentLayout(), "llm": ComponentLayout(ep=ep)},
        stages=(StageSpec(0, "encoder", 0, 1, 0), StageSpec(1, "llm", 0, 1, 1)),
    )


def _samples() -> dict[str, SampleWork]:
    meta = SampleMeta("s", ((112, 112),), 48)
    return {"s": SampleWork("s", 0.0, 0.0, meta)}


def test_plan_costs_price_experts_and_their_all_reduce():
    cost, samples = _cost(), _samples()
    ep1, ep2 = PlanCosts(_layout(1), cost, samples), PlanCosts(_layout(2), cost, samples)
    n = ep1.tokens(1, ("s",))
    for kind, phase in ((ActionKind.F, "fwd"), (ActionKind.B, "bwd")):
        extra = cost.expert_ms("llm", 0, n, phase, ep=2)
        assert extra > 0
        assert ep2.compute_ms(1, kind, ("s",)) == pytest.approx(ep1.compute_ms(1, kind, ("s",)) + extra)
    assert ep2.compute_ms(0, ActionKind.F, ("s",)) == ep1.compute_ms(0, ActionKind.F, ("s",))
    # model state: the experts' 800 bytes over ep 2
    assert ep2.model_state_bytes(1) == pytest.approx(600 * ADAM_BYTES_PER_BF16_WEIGHT_BYTE)
    # all-reduce: the dense 200 bytes over dp 4, the expert shard's 400 over the dp / ep = 2 replicas
    moved = 2 * 3 / 4 * 200 + 2 * 1 / 2 * 400
    assert ep2.allreduce_ms(1) == pytest.approx(0.05 + moved / 1e6)
    assert ep1.allreduce_ms(1) == pytest.approx(0.05 + 2 * 3 / 4 * 1000 / 1e6)


def test_dense_cost_model_json_unchanged_and_experts_round_trip():
    dense = _cost(experts=None)
    assert "experts" not in dense.to_json()["components"]["llm"]["layers"][0]
    moe = _cost(dataclasses.replace(EXPERTS, skew=1.25))
    back = CostModel.from_json(moe.to_json())
    assert back.llm.layers[0].experts == moe.llm.layers[0].experts
    assert back.has_experts("llm") and not back.has_experts("encoder") and back.num_experts("llm") == 8


def test_the_30b_a3b_preset_prices_its_experts():
    """Per sparse layer of ``qwen3vl-30b-a3b`` (hidden 2048, 128 experts of width 768, top-8): the
    experts' share of the linear FLOPs 8 * 6 * 2048 * 768 / (attention 2 * (2048 * 4096 * 2 + 2 * 2048
    * 512) + router 2 * 2048 * 128 + experts) = 75,497,472 / 113,770,496; all-to-all 2 * 8 * 2048 * 2
    bytes a token; the experts' bf16 parameters 2 * 128 * 3 * 2048 * 768 bytes."""
    from entrain.core.costs.presets import build_cost_model
    from entrain.models.families.qwen3_vl_moe.presets import QWEN3_VL_30B_A3B

    cost = build_cost_model(QWEN3_VL_30B_A3B, "a40-flops")
    sparse = [layer for layer in cost.llm.layers if layer.experts is not None]
    assert len(sparse) == 48 and not cost.has_experts("encoder")
    x = sparse[0].experts
    assert (x.num_experts, x.top_k) == (128, 8)
    assert x.fraction == pytest.approx(75_497_472 / 113_770_496, rel=1e-9)
    assert x.a2a_bytes_per_token == 65_536
    assert x.param_bytes == 2 * 128 * 3 * 2048 * 768
    # ep 8 on 4096 tokens a rank: 16 experts a rank, the busiest expert's rank ~2 % above the mean
    rho = x.rank_load_factor(4096, 8)
    assert 1.0 < rho < 1.05
