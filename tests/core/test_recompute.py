"""Activation recomputation in the cost model and Algorithm 2's search."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from entrain.core.costs.costmodel import RECOMPUTE_MODES
from entrain.core.costs.memory import choose_recompute
from entrain.core.costs.presets import build_cost_model
from entrain.core.costs.sampler import SampleStats
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.ir.plan import ActionKind
from entrain.core.planning.config_search import evaluate_config
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.workload.samples import SampleMeta

COST = build_cost_model("qwen25vl-llama3-1b", "a40-paper")
EAGER = build_cost_model("qwen25vl-llama3-1b", "a40-paper", attention="encoder=eager")


def pages(n: int, seed: int = 0) -> list[SampleMeta]:
    """Scanned pages of 2000-3500 px with long OCR text: heavy on both components."""
    rng = np.random.default_rng(seed)
    return [
        SampleMeta(
            f"p{i}",
            ((int(rng.integers(2000, 3500)), int(rng.integers(1500, 2500))),),
            int(rng.integers(300, 1500)),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(
    "comp,first,end", [("encoder", 0, 10), ("encoder", 5, 34), ("llm", 1, 9), ("llm", 10, 20)]
)
@pytest.mark.parametrize("cost", [COST, EAGER], ids=["flash", "eager"])
def test_recompute_trades_memory_for_time(comp, first, end, cost):
    """Kept bytes fall and recomputation time rises along none -> selective -> full."""
    COST = cost
    kept = [COST.kept_bytes_per_token(comp, first, end, m) for m in RECOMPUTE_MODES]
    extra = [
        sum(COST.recompute_ms(comp, i, (4096,), m, 1, 1) for i in range(first, end)) for m in RECOMPUTE_MODES
    ]
    assert kept[0][0] > kept[1][0] > kept[2][0] > 0
    assert kept[1][1] == kept[2][1] == 0.0 or first == 0
    assert extra[0] == 0.0 < extra[1] < extra[2]
    fwd = cost.stage_ms(comp, first, end, (4096,), "fwd")
    assert extra[2] == pytest.approx(fwd - (cost.layer_ms(comp, 0, (4096,), "fwd") if first == 0 else 0.0))


def test_plan_costs_price_the_planned_recomputation():
    """The simulator's prices follow a stage's ``recompute``: the backward grows by the re-run forward,
    kept activations shrink to the layer inputs, and the split backward's W is unchanged."""
    prof = pages(8)
    cfg = evaluate_config(
        prof, COST, ParallelConfig(dp=1, global_batch=8, microbatch_size=4), encoder=(1, 1, 2), llm=(1, 1, 2)
    )
    layout = cfg.to_layout()
    works = {m.id: COST.sample_work(m) for m in prof}
    ids = [m.id for m in prof[:4]]
    for mode in ("selective", "full"):
        stages = tuple(replace(s, recompute=mode) for s in layout.stages)
        base = PlanCosts(
            replace(layout, stages=tuple(replace(s, recompute="none") for s in stages)), COST, works
        )
        rec = PlanCosts(replace(layout, stages=stages), COST, works)
        for s in range(1, len(stages)):
            assert rec.activation_bytes(s, ids) < base.activation_bytes(s, ids)
            assert rec.compute_ms(s, ActionKind.B, ids) > base.compute_ms(s, ActionKind.B, ids)
            assert rec.compute_ms(s, ActionKind.W, ids) == pytest.approx(
                base.compute_ms(s, ActionKind.W, ids)
            )
            assert rec.recompute_transient_bytes(s, ids) > 0 == base.recompute_transient_bytes(s, ids)
        full = [
            COST.stage_ms(st.component, st.first_layer, st.end_layer, (), "fwd", num_calls=1) for st in stages
        ]
        assert all(f >= 0 for f in full)


def test_search_picks_the_cheapest_recomputation_that_fits():
    """Each stage gets the first mode of none, selective, full whose memory fits; the chosen mode's
    memory fits and the cheaper modes' do not; stage time includes the recomputation."""
    prof = pages(32)
    stats = SampleStats.of(prof)
    paper = ParallelConfig(dp=4, global_batch=512, microbatch_size=4)
    kw = dict(encoder=(2, 1, 4), llm=(2, 1, 4))
    cfg = evaluate_config(prof, COST, paper, **kw)
    limit = COST.hardware.device_memory_bytes
    roomy = replace(COST, hardware=replace(COST.hardware, device_memory_bytes=1e18))
    free = evaluate_config(prof, roomy, paper, **kw)
    assert cfg.memory_ok and not all(m <= limit for m in free.encoder.stage_memory_bytes)
    assert set(free.encoder.recompute) == {"none"}
    chosen = cfg.encoder.recompute + cfg.llm.recompute
    assert "none" in chosen and any(m != "none" for m in chosen)
    first = 0
    for comp in (cfg.encoder, cfg.llm):
        for j, (f, e) in enumerate(comp.layer_ranges):
            mode = comp.recompute[j]
            in_flight = 8 - (first + j)
            got = choose_recompute(stats, COST, comp.name, f, e, comp.tp, comp.cp, 4, in_flight, limit)
            assert got[0] == mode and got[1] == comp.stage_memory_bytes[j] <= limit
            cheaper = RECOMPUTE_MODES[: RECOMPUTE_MODES.index(mode)]
            for m in cheaper:
                from entrain.core.costs.memory import microbatch_load, stage_memory_bytes

                load = microbatch_load(stats, comp.name, 4)
                assert stage_memory_bytes(COST, comp.name, f, e, comp.tp, comp.cp, load, in_flight, m) > limit
        first += comp.pp
    slower = [a > b for a, b in zip(cfg.encoder.stage_ms, free.encoder.stage_ms)]
    assert slower == [m != "none" for m in cfg.encoder.recompute]
    assert cfg.to_layout().stages[0].recompute == cfg.encoder.recompute[0]


def test_small_calls_pay_an_efficiency_loss():
    """Below the preset's efficient size a call costs more per token ((n_min / n)^0.5), so cutting one
    microbatch into many small sub-microbatches is slower than running it whole; large calls are
    unaffected (the paper's workloads keep their fitted times)."""
    hw = COST.hardware
    assert hw.encoder_min_efficient_tokens == 512 and hw.llm_min_efficient_tokens == 256
    assert COST.small_call_factor("encoder", 4096) == 1.0 == COST.small_call_factor("llm", 256)
    assert COST.small_call_factor("encoder", 128) == pytest.approx(2.0)
    metas = [SampleMeta(f"t{i}", ((112, 112),), 30) for i in range(16)]  # 64 patches, ~46 tokens each
    cfg = evaluate_config(
        metas,
        COST,
        ParallelConfig(dp=1, global_batch=16, microbatch_size=16),
        encoder=(1, 1, 1),
        llm=(1, 1, 1),
    )
    costs = PlanCosts(cfg.to_layout(), COST, {m.id: COST.sample_work(m) for m in metas})
    ids = [m.id for m in metas]
    whole = costs.compute_ms(0, ActionKind.F, ids)
    pieces = sum(costs.compute_ms(0, ActionKind.F, ids[i : i + 2]) for i in range(0, 16, 2))
    const = COST.stage_ms("encoder", 0, COST.encoder.num_layers, (), "fwd", num_calls=1)
    assert pieces - 8 * const > 1.5 * (whole - const)
    roomy = replace(COST, hardware=replace(hw, encoder_min_efficient_tokens=0.0))
    flat = PlanCosts(cfg.to_layout(), roomy, {m.id: roomy.sample_work(m) for m in metas})
    assert sum(
        flat.compute_ms(0, ActionKind.F, ids[i : i + 2]) for i in range(0, 16, 2)
    ) - 8 * const == pytest.approx(flat.compute_ms(0, ActionKind.F, ids) - const)
