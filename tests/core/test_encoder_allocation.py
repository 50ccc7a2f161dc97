"""Planning with N encoders (``planning.encoders``): the audio tower priced from its layer specs like
the vision tower, the N-way allocation (each component at least one GPU, the least largest work per
GPU of all splits), the N-encoder Eq. 2, Algorithm 2 over every encoder's (TP, CP, PP) reducing to
the one-encoder search, and on an ``omni`` draw the allocation that gives each encoder GPUs in
proportion to its work and beats both ignoring the audio encoder and lumping its work into the
vision group."""

from __future__ import annotations

import itertools
import math
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.costs.costmodel import parallel_key
from entrain.core.costs.presets import build_cost_model, layer_specs
from entrain.core.costs.sampler import (
    SampleStats,
    draw_seed,
    encoder_share,
    pool_sampler,
    proportional_allocation,
)
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.model.architectures import get_arch
from entrain.core.planning.bmin import BMinConfig
from entrain.core.planning.config_search import search_candidates
from entrain.core.planning.encoders import (
    QWEN25_OMNI_7B_AUDIO,
    Encoder,
    allocate_gpus,
    audio_tower_specs,
    audio_units,
    component_totals,
    encoder_works,
    eq2_ms,
    find_b_min_encoders,
    max_work_per_gpu,
    price_encoder,
    search_encoders,
    vision_units,
)
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork
from entrain.data.generators import generate_samples

MODEL, HARDWARE = "qwen25vl-llama3-1b", "a40-flops"


@cache
def _encoders() -> tuple[Encoder, Encoder]:
    arch = get_arch(MODEL)
    vision = build_cost_model(arch, HARDWARE)
    audio = price_encoder(arch, audio_tower_specs(QWEN25_OMNI_7B_AUDIO), HARDWARE)
    return Encoder("vision", vision, vision_units), Encoder("audio", audio, audio_units)


@cache
def _omni(n: int = 128) -> tuple[SampleMeta, ...]:
    """The first ``n`` omni samples without a video (clips alone or with a photo: a video with its
    track would make the vision tower's work most of the draw)."""
    return tuple([s for s in generate_samples("omni", 2 * n, 0) if len(s.images) <= 1][:n])


# --- the audio tower's price ----------------------------------------------------------------------------
def test_audio_tower_priced_like_the_vision_tower():
    vision, audio = _encoders()
    kinds = {x.kind for x in audio.cost.encoder.layers}
    assert kinds <= {x.kind for x in vision.cost.encoder.layers}  # the same device rates price them
    assert audio.cost.encoder.num_layers == QWEN25_OMNI_7B_AUDIO.encoder_layers + 2
    assert audio.cost.llm == vision.cost.llm
    # priced from its own specs at the vision tower's rates: forward linear time in the FLOPs' ratio
    specs, key = audio_tower_specs(QWEN25_OMNI_7B_AUDIO), parallel_key(1, 1)
    flops = sum(s.lin_flops for s in specs) / sum(
        s.lin_flops for s in layer_specs(get_arch(MODEL))["encoder"]
    )
    ms = [sum(x.fwd[key].b for x in e.cost.encoder.layers) for e in (audio, vision)]
    assert [x.name for x in audio.cost.encoder.layers] == [s.name for s in specs]
    assert math.isclose(ms[0] / ms[1], flops, rel_tol=1e-9) and not math.isclose(flops, 1.0, rel_tol=0.01)
    image = SampleMeta("img", ((448, 448),), 50)
    clip = SampleMeta("clip", (), 50, audio=(400,))
    both = SampleMeta("both", ((448, 448),), 50, audio=(400,))
    w = {s.id: s for s in encoder_works([image, clip, both], [vision, audio])}
    assert w["img"].encoders[1] == 0.0 and w["clip"].encoders[0] == 0.0
    assert w["both"].encoders == (w["img"].encoders[0], w["clip"].encoders[1])
    # two 200-frame chunks attend apart: twice one chunk's work
    one = encoder_works([SampleMeta("c1", (), 50, audio=(200,))], [vision, audio])[0]
    assert math.isclose(w["clip"].encoders[1], 2 * one.encoders[1], rel_tol=1e-12)
    # Qwen2.5-Omni-7B's audio layers (width 1280, 32 layers) cost about what its vision blocks do per row
    per_row_audio = one.encoders[1] / 100
    per_row_vision = w["img"].encoders[0] / 1024  # 448x448: 1,024 patches
    assert 0.5 < per_row_audio / per_row_vision < 2.0


def test_raw_work_is_refused_with_the_sample_named():
    with pytest.raises(ConfigError, match="'r1'.*token metadata"):
        encoder_works([SampleWork("r1", 1.0, 2.0)], list(_encoders()))


# --- the N-way allocation -------------------------------------------------------------------------------
def _best_bottleneck(g: int, totals) -> float:
    n = len(totals)
    best = math.inf
    for cut in itertools.combinations(range(1, g), n - 1):  # every split with each component >= 1
        alloc = [b - a for a, b in zip((0, *cut), (*cut, g))]
        best = min(best, max_work_per_gpu(totals, alloc))
    return best


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.just(0.0), st.floats(0.01, 1e4)), min_size=2, max_size=4),
    st.integers(0, 8),
)
def test_allocation_is_the_least_bottleneck_split(totals, extra):
    g = len(totals) + extra
    alloc = allocate_gpus(g, totals)
    assert sum(alloc) == g and min(alloc) >= 1
    assert max_work_per_gpu(totals, alloc) <= _best_bottleneck(g, totals) * (1 + 1e-12)


def test_allocation_errors():
    with pytest.raises(ConfigError, match="at least 3 GPUs"):
        allocate_gpus(2, (1.0, 1.0, 1.0))
    with pytest.raises(ConfigError, match="non-negative"):
        allocate_gpus(4, (1.0, -1.0, 1.0))


def test_eq2_with_encoder_pipelines_side_by_side():
    assert eq2_ms([(3.0, 4.0)], (5.0,), 4) == 3 + 4 + 5 + 3 * 5  # one encoder: the paper's Eq. 2
    # the longest path is the slower encoder's (9 > 7), the pace the slowest stage of all (6)
    assert eq2_ms([(3.0, 4.0), (6.0, 3.0)], (5.0,), 4) == 9 + 5 + 3 * 6


# --- on an omni draw --------------------------------------------------------------------------------
@pytest.mark.parametrize("gpus", [8, 16])
def test_omni_allocation_is_proportional_and_beats_ignoring_or_lumping_audio(gpus):
    encoders = _encoders()
    samples = _omni()
    totals = component_totals(encoder_works(samples, encoders))
    alloc = allocate_gpus(gpus, totals)
    for g, t in zip(alloc, totals):
        assert abs(g - gpus * t / sum(totals)) <= 1.0
    assert alloc[1] >= 2  # audio is a fifth of the work here: more than the minimum
    ignoring_audio = allocate_gpus(gpus, (totals[0], 0.0, totals[2]))  # audio left with one GPU
    assert max_work_per_gpu(totals, alloc) < 0.8 * max_work_per_gpu(totals, ignoring_audio)

    parallel = ParallelConfig(gpus=gpus, dp=1, tp=None, cp=1, global_batch=128, microbatch_size=4)
    best = search_encoders(samples, encoders, parallel)[0]
    assert best.memory_ok and best.allocation == alloc
    for c, budget in zip((*best.encoders, best.llm), alloc):
        assert c.gpus <= budget
    assert [c.name for c in best.encoders] == ["vision", "audio"]
    assert best.predicted_iteration_time_ms == eq2_ms(
        [c.stage_ms for c in best.encoders], best.llm.stage_ms, best.num_microbatches
    )
    bug = search_encoders(samples, encoders, parallel, allocation=ignoring_audio)[0]
    assert best.predicted_iteration_time_ms < 0.8 * bug.predicted_iteration_time_ms
    # today's one-encoder plan: the audio clips priced as rows of the vision tower, in its stages
    lumped = search_candidates(SampleStats.of(samples), encoders[0].cost, parallel)[0]
    assert best.predicted_iteration_time_ms < lumped.predicted_iteration_time_ms


def test_one_encoder_search_is_algorithm_2():
    """With one encoder (the one-encoder cost model's own units) and the paper's split, the N-encoder
    search deploys what ``config_search`` deploys, at the same Eq. 2 time."""
    vision, _ = _encoders()
    lumped = Encoder("encoder", vision.cost, lambda s: s.encoder_units)
    samples = _omni(64)
    stats = SampleStats.of(samples)
    parallel = ParallelConfig(gpus=8, dp=1, tp=None, cp=1, global_batch=64, microbatch_size=4)
    split = proportional_allocation(8, encoder_share(stats, vision.cost))
    every = search_candidates(stats, vision.cost, parallel, allocation=split)
    visited = search_encoders(samples, [lumped], parallel, allocation=split)

    def degrees(e, m, t):
        return (e.tp, e.cp, e.pp, m.tp, m.cp, m.pp, t)

    assert sorted(degrees(c.encoders[0], c.llm, c.predicted_iteration_time_ms) for c in visited) == sorted(
        degrees(c.encoder, c.llm, c.predicted_iteration_time_ms) for c in every
    )
    ours, theirs = visited[0], every[0]
    assert ours.predicted_iteration_time_ms == theirs.predicted_iteration_time_ms
    for a, b in ((ours.encoders[0], theirs.encoder), (ours.llm, theirs.llm)):
        assert (a.tp, a.cp, a.pp, a.layer_ranges, a.stage_ms, a.recompute) == (
            b.tp, b.cp, b.pp, b.layer_ranges, b.stage_ms, b.recompute,
        )  # fmt: skip


def test_algorithm_1_waits_for_the_audio_split_to_settle():
    """Small images and short texts, one clip in four 30 s long and the rest 1 s: the audio encoder
    earns a second GPU, and the three-way split settles only at larger draws than the vision/LLM split
    (which sees the clips only as LLM tokens)."""
    pool = [
        SampleMeta(f"p{i}", ((224, 224),), 200, audio=(3000,) if i % 4 == 0 else (100,)) for i in range(100)
    ]
    config = BMinConfig(max_batch_size=512)
    both = find_b_min_encoders(pool_sampler(pool), _encoders(), 8, config)
    vision_only = find_b_min_encoders(pool_sampler(pool), _encoders()[:1], 8, config)
    assert both.converged and vision_only.converged
    assert both.b_min > vision_only.b_min
    assert [t.stable for t in both.trials] == [False] * (len(both.trials) - 1) + [True]
    draw = pool_sampler(pool)(both.b_min, draw_seed(config.seed, both.b_min, 0))
    assert both.allocation == allocate_gpus(8, component_totals(encoder_works(draw, _encoders())))
    assert both.allocation[1] == 2 and sum(both.allocation) == 8
