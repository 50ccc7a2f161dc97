"""Algorithm 2 searches expert parallelism (``--ep``) with TP / PP / DP on a model with experts: the
degrees dividing DP and the experts, never with tensor parallelism on the LLM; the chosen
configuration and its layout record ``ep``; a dense model searches only ``ep`` 1 and reports none;
``--ep`` that cannot shard the model is refused by name."""

from __future__ import annotations

import pytest

from entrain.core.costs.presets import build_cost_model
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.ir.plan import Layout
from entrain.core.planning.config_search import ep_options, evaluate_config, search_candidates
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork
from entrain.models.families.qwen3_vl_moe.presets import QWEN3_VL_30B_A3B


@pytest.fixture(scope="module")
def moe():
    return build_cost_model(QWEN3_VL_30B_A3B, "a40-paper")


@pytest.fixture(scope="module")
def dense():
    return build_cost_model("qwen25vl-llama3-1b", "a40-paper")


def _batch(n: int = 32) -> list[SampleWork]:
    metas = [SampleMeta(f"s{i}", ((448 + 28 * (i % 5), 448),), 300 + 40 * (i % 7)) for i in range(n)]
    return [SampleWork(m.id, 0.0, 0.0, m) for m in metas]


def test_ep_options_divide_dp_and_the_experts(moe, dense):
    assert ep_options(moe, 8, None) == [1, 2, 4, 8]
    assert ep_options(moe, 6, None) == [1, 2]  # 3 and 6 do not divide 128 experts
    assert ep_options(moe, 8, 4) == [4] and ep_options(moe, 6, 4) == []
    assert ep_options(dense, 8, None) == [1]


def test_the_search_shards_experts_where_one_rank_cannot_hold_them(moe):
    """48 GPUs at DP 2 (10 a replica for the LLM): the 30B-A3B's 29 B expert parameters (18 bytes
    each with AdamW) overflow its stages at ep 1 and fit at ep 2; the best feasible candidate records
    ep 2 in its config, its layout and the ``config`` JSON."""
    cands = search_candidates(
        _batch(), moe, ParallelConfig(gpus=48, dp=2, global_batch=32, microbatch_size=1)
    )
    assert {c.llm.ep for c in cands} == {1, 2}
    assert all(c.llm.tp == 1 for c in cands if c.llm.ep > 1)
    assert all(c.encoder.ep is None for c in cands)
    best = cands[0]
    assert best.memory_ok and best.llm.ep == 2
    same = [
        c
        for c in cands
        if c.llm.ep == 1 and (c.llm.tp, c.llm.pp, c.encoder.pp) == (1, best.llm.pp, best.encoder.pp)
    ]
    assert same and not same[0].memory_ok
    assert max(same[0].llm.stage_memory_bytes) > max(best.llm.stage_memory_bytes)
    layout = best.to_layout()
    assert layout.components["llm"].ep == 2 and layout.components["encoder"].ep == 1
    assert Layout.from_json(layout.to_json()) == layout
    assert (
        best.to_json()["components"]["llm"]["ep"] == 2 and "ep" not in best.to_json()["components"]["encoder"]
    )
    assert not layout.can_move_encoder_work  # replicas sharing experts run the same programs


def test_ep_is_searched_without_tensor_parallelism(moe):
    par = ParallelConfig(gpus=48, dp=2, tp=None, global_batch=32, microbatch_size=1)
    cands = search_candidates(_batch(), moe, par)
    assert {c.llm.tp for c in cands if c.llm.ep == 1} > {1} and {c.llm.tp for c in cands if c.llm.ep > 1} == {
        1
    }


def test_ep_prices_the_all_to_all_into_the_stage_times(moe):
    par = ParallelConfig(gpus=48, dp=2, global_batch=32, microbatch_size=1)
    one = evaluate_config(_batch(), moe, par, encoder=(1, 1, 14), llm=(1, 1, 10))
    two = evaluate_config(_batch(), moe, ParallelConfig(gpus=48, dp=2, ep=2, global_batch=32, microbatch_size=1),
                          encoder=(1, 1, 14), llm=(1, 1, 10))  # fmt: skip
    assert one.llm.ep == 1 and two.llm.ep == 2
    assert sum(two.llm.stage_ms) > sum(one.llm.stage_ms)  # dispatch + combine on the data-parallel link
    assert two.encoder.stage_ms == one.encoder.stage_ms


def test_a_dense_model_searches_no_ep_and_reports_none(dense):
    cands = search_candidates(
        _batch(), dense, ParallelConfig(gpus=8, dp=2, global_batch=32, microbatch_size=1)
    )
    assert all(c.llm.ep is None and c.encoder.ep is None for c in cands)
    assert "ep" not in cands[0].to_json()["components"]["llm"]
    assert "ep" not in cands[0].to_layout().to_json()["components"]["llm"]


@pytest.mark.parametrize(
    "which,ep,dp,tp,match",
    [
        ("dense", 2, 2, 1, "has none"),
        ("moe", 4, 2, 1, "must divide the data-parallel degree"),
        ("moe", 3, 3, 1, "number of experts"),
        ("moe", 2, 2, 2, "tensor parallelism"),
    ],
)
def test_an_ep_that_cannot_shard_the_model_is_refused(which, ep, dp, tp, match, moe, dense):
    cost = moe if which == "moe" else dense
    par = ParallelConfig(gpus=16 * dp, dp=dp, tp=tp, ep=ep, global_batch=6 * dp, microbatch_size=1)
    with pytest.raises(ConfigError, match=match):
        search_candidates(_batch(6 * dp), cost, par)
