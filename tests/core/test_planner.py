"""Planner: Algorithm 1 (b_min), Algorithm 2 (config search) and the baselines' configurations."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from entrain.core.costs.presets import build_cost_model
from entrain.core.costs.sampler import SampleStats, pool_sampler, proportional_allocation
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.planning.baselines import (
    PAPER_TABLE1,
    dip_layout,
    disttrain_profile_sample,
    paper_table1_config,
)
from entrain.core.planning.bmin import BMinConfig, find_b_min, num_validation_trials
from entrain.core.planning.config_search import evaluate_config, search_candidates, search_config
from entrain.core.planning.entry import plan
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork

COST_1B = build_cost_model("qwen25vl-llama3-1b", "a40-paper")


def meta_pool(n: int, seed: int = 0) -> list[SampleMeta]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(1, 3))
        imgs = tuple((int(rng.integers(200, 1500)), int(rng.integers(200, 1500))) for _ in range(k))
        out.append(SampleMeta(f"m{i:04d}", imgs, int(rng.integers(20, 600))))
    return out


def test_num_validation_trials():
    assert num_validation_trials(0.05, 0.05) == 59
    assert num_validation_trials(0.01, 0.05) == 90
    with pytest.raises(ConfigError):
        num_validation_trials(0.0, 0.05)


def test_proportional_allocation_rounding():
    assert proportional_allocation(16, 0.56) == (9, 7)  # 8.96 -> 9
    assert proportional_allocation(16, 8.5 / 16) == (8, 8)  # tie -> LLM
    assert proportional_allocation(16, 9.5 / 16) == (9, 7)
    assert proportional_allocation(16, 0.99) == (15, 1) and proportional_allocation(16, 0.0) == (1, 15)
    assert proportional_allocation(2, 0.9) == (1, 1)
    with pytest.raises(ConfigError):
        proportional_allocation(1, 0.5)


@given(st.integers(2, 64), st.floats(0.0, 1.0))
def test_allocation_is_nearest_feasible(g, share):
    e, m = proportional_allocation(g, share)
    assert e + m == g and e >= 1 and m >= 1
    if 1 <= round(g * share) <= g - 1:
        assert abs(e - g * share) <= 0.5 + 1e-9


def test_vectorised_work_matches_cost_model():
    samples = meta_pool(20)
    for cost in (COST_1B, build_cost_model("tiny", "cpu-tiny", freeze=("vit",)),
                 build_cost_model("qwen25vl-llama3-3b", "a40-flops", freeze=("llm",))):  # fmt: skip
        for tp, cp in ((1, 1), (2, 1), (2, 2)):
            enc, llm = SampleStats.of(samples).work(cost, tp, cp)
            for j, s in enumerate(samples):
                w = cost.sample_work(s, tp, cp)
                assert enc[j] == pytest.approx(w.encoder, rel=1e-9)
                assert llm[j] == pytest.approx(w.llm, rel=1e-9)


def raw_sampler(spread: float):
    """Raw-work items with encoder share around 0.625 (10 of 16 GPUs) and the given relative spread."""

    def sample(n, seed):
        rng = np.random.default_rng(seed)
        enc = 60.0 * (1.0 + spread * rng.uniform(-1, 1, n))
        return [SampleWork(f"r{seed}-{i}", float(e), 36.0) for i, e in enumerate(enc)]

    return sample


def test_b_min_doubles_until_stable_and_is_deterministic():
    on_16 = ParallelConfig(gpus=16, dp=1, global_batch=512, microbatch_size=4)  # batch: unused here
    res = find_b_min(raw_sampler(0.9), COST_1B, on_16, BMinConfig(n0=4, seed=3))
    assert res.converged and res.k_trials == 59
    sizes = [t.batch_size for t in res.trials]
    assert sizes == [4 * 2**i for i in range(len(sizes))] and sizes[-1] == res.b_min
    assert all(not t.stable for t in res.trials[:-1]) and res.trials[-1].stable
    assert res.trials[-1].allocations_seen == (res.allocation,)
    assert res.allocation == (10, 6)  # 16 * 0.625 = 10
    assert any(len(t.allocations_seen) > 1 for t in res.trials[:-1])
    assert all(list(t.allocations_seen) == sorted(t.allocations_seen, reverse=True) for t in res.trials)
    again = find_b_min(raw_sampler(0.9), COST_1B, on_16, BMinConfig(n0=4, seed=3))
    assert again == res
    # no variance: the first size is stable
    assert find_b_min(raw_sampler(0.0), COST_1B, on_16, BMinConfig(n0=4)).b_min == 4
    # extra sizes are evaluated and reported in order
    res2 = find_b_min(raw_sampler(0.9), COST_1B, on_16, BMinConfig(extra_sizes=(1, 1024)))
    assert [t.batch_size for t in res2.trials][0] == 1 and res2.trial(1024).stable


def test_evaluate_config_eq2_and_ranges():
    prof = meta_pool(64)
    paper = ParallelConfig(dp=4, global_batch=512, microbatch_size=4)
    cfg = evaluate_config(prof, COST_1B, paper, encoder=(2, 1, 5), llm=(2, 1, 3))
    stages = cfg.encoder.stage_ms + cfg.llm.stage_ms
    assert cfg.num_microbatches == 32
    assert cfg.predicted_iteration_time_ms == pytest.approx(sum(stages) + 31 * max(stages))
    for comp in (cfg.encoder, cfg.llm):
        assert comp.layer_ranges[0][0] == 0 and comp.layer_ranges[-1][1] == len(comp.layer_names)
        assert len(comp.layer_ranges) == comp.pp
    assert cfg.memory_ok
    # earlier stages hold more in-flight activations
    layout = cfg.to_layout()
    assert [s.stage for s in layout.stages] == [s.pp_rank for s in layout.stages] == list(range(8))
    assert layout.num_encoder_stages == 5 and layout.global_batch == 512
    assert layout.components["llm"].pp == 3 and layout.components["encoder"].tp == 2
    assert [s.component for s in layout.stages] == ["encoder"] * 5 + ["llm"] * 3
    with pytest.raises(ConfigError, match="not divisible"):
        evaluate_config(
            prof,
            COST_1B,
            ParallelConfig(dp=4, global_batch=100, microbatch_size=4),
            encoder=(1, 1, 1),
            llm=(1, 1, 1),
        )


def test_search_config_is_best_candidate():
    prof = meta_pool(64)
    searched = ParallelConfig(gpus=32, dp=None, tp=None, cp=None, global_batch=256, microbatch_size=4)
    cands = search_candidates(prof, COST_1B, searched)
    assert len(cands) > 10
    for c in cands:
        assert c.gpus_used_per_replica <= c.gpus_per_replica
        assert c.encoder.pp * c.encoder.tp * c.encoder.cp <= c.allocation[0] + c.encoder.tp * c.encoder.cp
    best = search_config(prof, COST_1B, searched)
    feasible = [c for c in cands if c.memory_ok]
    assert best.predicted_iteration_time_ms == min(c.predicted_iteration_time_ms for c in feasible)
    # PP is floor / ceil of the GPU budget over TP x CP
    fixed = search_candidates(
        prof, COST_1B, ParallelConfig(gpus=16, dp=1, tp=2, global_batch=64, microbatch_size=4)
    )
    for c in fixed:
        m_enc, m_llm = c.allocation
        assert c.encoder.pp in (m_enc // 2, -(-m_enc // 2)) and c.llm.pp in (m_llm // 2, -(-m_llm // 2))


def test_memory_check_rejects():
    small = dataclasses.replace(
        COST_1B, hardware=dataclasses.replace(COST_1B.hardware, device_memory_bytes=1e9)
    )
    with pytest.raises(ConfigError, match="device memory"):
        search_config(meta_pool(16), small, ParallelConfig(gpus=8, dp=1, global_batch=16, microbatch_size=4))


def test_plan_picks_best_dp():
    res = plan(
        pool_sampler(meta_pool(500)),
        COST_1B,
        ParallelConfig(gpus=32, tp=2, global_batch=256, microbatch_size=4),
    )
    assert set(res.per_dp) <= {1, 2, 4, 8, 16}
    assert res.config.predicted_iteration_time_ms == min(
        c.predicted_iteration_time_ms for _, c in res.per_dp.values()
    )
    assert res.b_min is res.per_dp[res.config.dp][0]


def test_disttrain_profile_sample_is_median_ratio():
    pool = meta_pool(300)
    s = disttrain_profile_sample(pool_sampler(pool), COST_1B, seed=1, num_draw=101)
    items = pool_sampler(pool)  # same draw again
    from entrain.core.costs.sampler import draw_seed

    drawn = items(101, draw_seed(1, 101, 0x0D15))
    ratios = sorted((COST_1B.sample_work(x).encoder / COST_1B.sample_work(x).llm, x.id) for x in drawn)
    assert s.id == ratios[50][1]
    assert disttrain_profile_sample(pool_sampler(pool), COST_1B, seed=1, num_draw=101) == s


def test_paper_table1_and_dip_layout():
    prof = meta_pool(4)
    cfg = paper_table1_config(
        "synthchartnet", "qwen25vl-llama3-3b", prof[:1], build_cost_model("qwen25vl-llama3-3b", "a40-paper")
    )
    assert (cfg.dp, cfg.encoder.tp, cfg.encoder.pp, cfg.llm.pp, cfg.num_microbatches) == (4, 2, 5, 3, 32)
    cfg = paper_table1_config("llava_instruct_150k", "qwen25vl-llama3-1b", prof, COST_1B, system="entrain")
    assert (cfg.encoder.pp, cfg.llm.pp) == (4, 4)
    with pytest.raises(ConfigError, match="Table 1 has no configuration"):
        paper_table1_config("skewed", "tiny", prof, COST_1B)
    layout = dip_layout(prof, COST_1B, ParallelConfig(dp=4, global_batch=512, microbatch_size=4), pp=8)
    assert layout.ranks_per_replica == 8 and len(layout.stages) == 16
    assert [s.pp_rank for s in layout.stages] == list(range(8)) * 2
    enc = [s for s in layout.stages if s.component == "encoder"]
    assert enc[0].first_layer == 0 and enc[-1].end_layer == COST_1B.encoder.num_layers


@pytest.mark.parametrize("model", ["qwen25vl-llama3-1b", "qwen25vl-llama3-3b"])
def test_a40_paper_reproduces_table1_entrain_configs(model):
    """With the fitted a40-paper preset the planner picks Table 1's Entrain E.PP/L.PP (all but
    CocoQA + 3B, whose 8:8 GPU split of Table 11 cannot give 3/5 with TP 2)."""
    gen = pytest.importorskip("entrain.data.generators")
    cost = build_cost_model(model, "a40-paper")
    for dataset in ("synthchartnet", "llava150k", "chartqa", "cocoqa"):
        paper = ParallelConfig(gpus=64, dp=4, tp=2, global_batch=512, microbatch_size=4)
        res = plan(pool_sampler(gen.generate_samples(dataset, 1 << 13, 0)), cost, paper)
        assert res.b_min.b_min <= 256
        got = (res.config.encoder.pp, res.config.llm.pp)
        if (dataset, model) != ("cocoqa", "qwen25vl-llama3-3b"):
            assert got == PAPER_TABLE1[(dataset, model)]["entrain"], dataset


def test_budget_beyond_layer_count_is_clamped():
    cost = build_cost_model("tiny", "cpu-tiny")
    cfg = search_config(
        meta_pool(32), cost, ParallelConfig(gpus=64, dp=2, global_batch=64, microbatch_size=4)
    )
    assert cfg.encoder.pp == cost.encoder.num_layers  # 4 layers, budget far larger
    assert all(e - f == 1 for f, e in cfg.encoder.layer_ranges)
    assert cfg.gpus_used_per_replica <= 32


@pytest.mark.parametrize("ranks", [2, 5, 8])
def test_boundary_sharing_covers_layers_and_is_no_slower_than_any_disjoint_split(ranks):
    """One min-max partition of the concatenated encoder-then-LLM layers: every layer on exactly one
    stage, stages on consecutive ranks (a rank holds two only where encoder meets LLM), and the slowest
    rank no slower than the slowest stage of any disjoint E:L split of the same ranks."""
    from dataclasses import replace

    from entrain.core.planning.boundary import boundary_sharing_config

    profile = meta_pool(64)
    parallel = ParallelConfig(dp=4, tp=2, global_batch=512, microbatch_size=4)
    # memory unbounded: no stage recomputes, so rank times are the partition's alone
    cost = replace(COST_1B, hardware=replace(COST_1B.hardware, device_memory_bytes=1e18))
    cfg = boundary_sharing_config(profile, cost, parallel, ranks=ranks)
    layout = cfg.layout
    assert layout.ranks_per_replica == ranks and len(cfg.rank_ms) == ranks
    for comp in ("encoder", "llm"):
        ranges = [(s.first_layer, s.end_layer) for s in layout.stages if s.component == comp]
        assert ranges[0][0] == 0 and ranges[-1][1] == COST_1B.component(comp).num_layers
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    per_rank = [len(layout.stages_of(r)) for r in range(ranks)]
    assert sum(per_rank) == len(layout.stages) <= ranks + 1 and max(per_rank) <= 2
    assert cfg.shares_boundary == (len(layout.stages) == ranks + 1)
    disjoint = [
        evaluate_config(profile, cost, parallel, encoder=(2, 1, e), llm=(2, 1, ranks - e))
        for e in range(1, ranks)
    ]
    best = min(max(c.encoder.stage_ms + c.llm.stage_ms) for c in disjoint)
    assert max(cfg.rank_ms) <= best * (1 + 1e-12)
    assert sum(cfg.rank_ms) == pytest.approx(sum(disjoint[0].encoder.stage_ms + disjoint[0].llm.stage_ms))
    k = layout.num_microbatches
    assert cfg.predicted_iteration_time_ms == pytest.approx(sum(cfg.rank_ms) + (k - 1) * max(cfg.rank_ms))


def test_eager_attention_adds_the_saved_scores_to_stage_memory():
    """Eager attention keeps 6 bytes per score per head: the first (one-stage) encoder of a
    full-attention tower holds ``num_stages`` microbatches of ``U * mean(sum of patches^2)`` scores
    more than with flash attention; the planner's and the simulator's accounting agree."""
    from entrain.core.schedules.action_costs import PlanCosts

    prof = meta_pool(64)
    kw = dict(encoder=(1, 1, 1), llm=(1, 1, 1))
    one = ParallelConfig(dp=1, global_batch=16, microbatch_size=4)
    from dataclasses import replace

    flash = build_cost_model("qwen25vl-fullatt-llama3-1b", "a40-flops", attention="flash")
    eager = build_cost_model("qwen25vl-fullatt-llama3-1b", "a40-flops", attention="encoder=eager")
    # memory unbounded: no recomputation hides the scores
    flash, eager = (
        replace(c, hardware=replace(c.hardware, device_memory_bytes=1e18)) for c in (flash, eager)
    )
    a, b = evaluate_config(prof, flash, one, **kw), evaluate_config(prof, eager, one, **kw)
    stats = SampleStats.of(prof)
    extra = 2 * 4 * float(stats.enc_x2.mean()) * 32 * 16 * 6.0
    assert b.encoder.stage_memory_bytes[0] - a.encoder.stage_memory_bytes[0] == pytest.approx(extra)
    assert b.llm.stage_memory_bytes == a.llm.stage_memory_bytes
    works = {m.id: eager.sample_work(m) for m in prof[:4]}
    costs = PlanCosts(b.to_layout(), eager, works)
    squares = sum(p * p for m in prof[:4] for p in m.vit_patches_per_image)
    tokens = sum(m.vit_patches for m in prof[:4])
    per_token = sum(layer.activation_bytes_per_token for layer in eager.encoder.layers)
    assert costs.activation_bytes(0, list(works)) == pytest.approx(
        per_token * tokens + 32 * 16 * 6.0 * squares
    )


def test_samples_without_size_dependent_work_still_get_candidates():
    """A measured profile of tiny sizes can fit per-call constants only: every sample's work is 0,
    and ProportionalAllocation splits the GPUs evenly instead of dividing by zero."""
    from entrain.core.planning.config_search import search_candidates
    from entrain.core.workload.work import SampleWork

    cost = build_cost_model("tiny", "cpu-tiny")
    zero = [SampleWork(f"s{i}", 0.0, 0.0) for i in range(8)]
    found = search_candidates(zero, cost, ParallelConfig(gpus=4, dp=1, global_batch=8, microbatch_size=1))
    assert found and all(c.allocation == (2, 2) for c in found)


def test_below_b_min_warning_is_one_message():
    """The one below-``b_min`` warning (``train``'s check and the runtime's both print it)."""
    from entrain.core.planning.bmin import below_b_min_warning

    text = below_b_min_warning(64, 4, 32)
    assert "--global-batch 64 (16 per replica) is below b_min = 32" in text
    assert text.endswith("use --global-batch 128 or more")
    assert below_b_min_warning(128, 4, 32) is None and below_b_min_warning(64, 4, None) is None
