"""Audio rows are the audio tower's wherever the planner reads them: the one-encoder cost model of an
omni shape runs the audio tower on its first encoder layer (``LayerCost.audio``), and the planner's
column statistics (``SampleStats``: Algorithm 1's shares, Algorithm 2's mean per-layer times, the
recomputation price) and the simulator's stage prices give a sample's audio rows that tower's price,
as ``CostModel.units`` does, instead of pricing them as rows of the vision tower's layers. One rule
says which rows are whose (``SampleMeta.vision_units`` / ``audio_units``)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from entrain.core.costs.costmodel import EncoderUnits
from entrain.core.costs.memory import recompute_ms
from entrain.core.costs.presets import build_cost_model
from entrain.core.costs.sampler import SampleStats, mean_layer_ms
from entrain.core.ir.plan import ActionKind
from entrain.core.model.omni import QWEN25_OMNI_7B
from entrain.core.planning.encoders import audio_units, vision_units
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.workload.samples import SampleMeta
from entrain.models.families.base import ModelSource
from entrain.models.families.registry import family_of_preset
from tests.sim.fixtures import disjoint_layout

METAS = (
    SampleMeta("clip", (), 20, audio=(1000,)),
    SampleMeta("both", ((448, 448),), 20, audio=(3000, 150)),
    SampleMeta("video", (), 30, video=((4, 16, 16),), audio=(700,)),
    SampleMeta("image", ((224, 336),), 50),
    SampleMeta("text", (), 80),
)


@functools.cache
def _cost():
    shape = family_of_preset(QWEN25_OMNI_7B).shape(ModelSource(preset=QWEN25_OMNI_7B))
    return build_cost_model(shape, "a40-flops")


def test_one_rule_splits_every_encoder_row_by_tower():
    cost = _cost()
    assert cost.audio_tower
    for m in METAS:
        assert m.encoder_units == m.vision_units + m.audio_units
        assert (vision_units(m), audio_units(m)) == (m.vision_units, m.audio_units)
        units = cost.units("encoder", m)
        if m.audio:
            assert isinstance(units, EncoderUnits)
            assert (units.vision, units.audio) == (m.vision_units, m.audio_units)
    stats = SampleStats.of(METAS)
    for comp, rows in (("audio", lambda m: m.audio_units), ("vision", lambda m: m.vision_units)):
        x1, x2 = stats.columns(comp)
        assert x1.tolist() == [float(sum(rows(m))) for m in METAS]
        assert x2.tolist() == [float(sum(u * u for u in rows(m))) for m in METAS]
    assert stats.columns("encoder")[0].tolist() == [float(sum(m.encoder_units)) for m in METAS]
    assert SampleStats.of(METAS[3:]).aud_x1 is None  # no audio: the columns as before


def test_column_statistics_price_audio_rows_by_the_audio_tower():
    """Per-sample work from the columns (Algorithm 1's share, the baselines' ratios) equals the cost
    model's own per-sample work, which prices a clip by the audio tower's layers."""
    cost = _cost()
    enc, llm = SampleStats.of(METAS).work(cost)
    for m, e, w in zip(METAS, enc, llm):
        exact = cost.sample_work(m)
        assert e == pytest.approx(exact.encoder, rel=1e-9, abs=1e-12), m.id
        assert w == pytest.approx(exact.llm, rel=1e-9), m.id


@pytest.mark.parametrize("tp", [1, 2])
def test_mean_layer_times_price_audio_rows_by_the_audio_tower(tp):
    """Algorithm 2's per-layer mean microbatch times: the mean of the samples' own layer times (the
    audio tower's on the first layer, nothing of a clip on the others), times the small-call factor of
    the mean call's every row, plus each layer's per-call constant."""
    cost = _cost()
    stats = SampleStats.of(METAS)
    u = 3
    got = mean_layer_ms(stats, cost, "encoder", tp, 1, u)
    n = cost.encoder.num_layers
    rows = np.mean([sum(m.encoder_units) for m in METAS])
    factor = cost.small_call_factor("encoder", u * rows)
    for i in range(n):
        var = np.mean(
            [
                sum(
                    cost.layer_ms("encoder", i, cost.units("encoder", m), p, tp, 1, 0) for p in ("fwd", "bwd")
                )
                for m in METAS
            ]
        )
        const = sum(cost.layer_ms("encoder", i, (), p, tp, 1, 1) for p in ("fwd", "bwd"))
        assert got[i] == pytest.approx(factor * u * var + const, rel=1e-9), i


def test_recompute_price_leaves_the_audio_rows_out():
    """The planner's recomputation price re-runs the vision rows only, as ``CostModel.recompute_ms``."""
    cost = _cost()
    stats = SampleStats.of(METAS)
    n = cost.encoder.num_layers
    got = recompute_ms(stats, cost, "encoder", 0, n, 1, 1, 1, "selective")
    exact = np.mean(
        [
            sum(
                cost.recompute_ms("encoder", i, cost.units("encoder", m), "selective", 1, 1, 0)
                for i in range(n)
            )
            for m in METAS
        ]
    )
    const = sum(cost.recompute_ms("encoder", i, (), "selective", 1, 1, 1) for i in range(n))
    assert got == pytest.approx(exact + const, rel=1e-9)


@pytest.mark.parametrize("ids", [("clip",), ("both", "image"), ("video", "text", "clip")])
def test_simulator_prices_the_audio_towers_stage_by_its_layers(ids):
    """A one-encoder plan (both towers in the first stages): the first encoder stage's actions cost the
    samples' own stage times (the audio tower's on their clips), the later encoder stages none of a
    clip's rows."""
    cost = _cost()
    n, m = cost.encoder.num_layers, cost.llm.num_layers
    layout = disjoint_layout(2, 1, enc_layers=n, llm_layers=m)
    samples = {x.id: cost.sample_work(x) for x in METAS}
    costs = PlanCosts(layout, cost, samples)
    assert costs.tabled == (True, True, False)
    rows = sum(sum(samples[s].meta.encoder_units) for s in ids)
    factor = cost.small_call_factor("encoder", rows)
    overhead = cost.hardware.action_overhead_ms
    for stage in (0, 1):
        spec = layout.stages[stage]
        for kind, phase in ((ActionKind.F, "fwd"), (ActionKind.B, "bwd")):
            var = sum(
                cost.stage_ms("encoder", spec.first_layer, spec.end_layer, cost.units("encoder", samples[s].meta),
                              phase, num_calls=0)
                for s in ids
            )  # fmt: skip
            const = cost.stage_ms("encoder", spec.first_layer, spec.end_layer, (), phase, num_calls=1)
            assert costs.compute_ms(stage, kind, ids) == pytest.approx(
                factor * var + const + overhead, rel=1e-9
            )
    clip_only = costs.compute_ms(1, ActionKind.F, ("clip",))
    const = cost.stage_ms("encoder", layout.stages[1].first_layer, n, (), "fwd", num_calls=1)
    assert clip_only == pytest.approx(const + overhead, rel=1e-9)  # the vision layers see no clip row
