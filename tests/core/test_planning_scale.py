"""Planning at scale: the optimised Algorithm 1 + 2 path (columnar draws, numpy
min-max partition, per-stage cost caches, column-wise pricing) gives exactly what the plain path gives."""

from dataclasses import replace
from itertools import accumulate

import numpy as np
import pytest

from entrain.core.costs import memory
from entrain.core.costs.memory import memory_check_iterations
from entrain.core.costs.presets import build_cost_model
from entrain.core.costs.sampler import SampleStats, pool_sampler
from entrain.core.costs.table_work import draw_works
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.planning import config_search
from entrain.core.planning.config_search import search_candidates
from entrain.core.planning.entry import plan
from entrain.core.planning.partition import Partition
from entrain.core.workload.sample_table import SampleTable
from entrain.core.workload.samples import SampleMeta, VisionTokenConfig


def random_samples(seed: int, n: int) -> list[SampleMeta]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        images = tuple((int(h), int(w)) for h, w in rng.integers(224, 1025, (int(rng.integers(0, 5)), 2)))
        text = int(rng.integers(20, 2001))
        answer = int(rng.integers(0, text + 1)) if rng.random() < 0.3 else None
        out.append(SampleMeta(f"s{i}", images, text, answer_tokens=answer))
    return out


def scalar_partition(layer_ms, num_stages, forbidden_cuts=()):
    """The min-max recurrence one scalar at a time (the partitioner before vectorisation; these models
    forbid no cut)."""
    assert not forbidden_cuts
    n = len(layer_ms)
    prefix = [0.0, *accumulate(float(x) for x in layer_ms)]
    inf = float("inf")
    suffix = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    for i in range(n):
        suffix[1][i] = prefix[n] - prefix[i]
    for q in range(2, num_stages + 1):
        for i in range(n - q + 1):
            suffix[q][i] = min(max(prefix[j] - prefix[i], suffix[q - 1][j]) for j in range(i + 1, n - q + 2))
    best = suffix[num_stages][0]
    limit = best + 1e-12 * max(abs(best), 1.0)
    bounds, start = [], 0
    for q in range(num_stages, 1, -1):
        end = next(
            j
            for j in range(start + 1, n - q + 2)
            if prefix[j] - prefix[start] <= limit and suffix[q - 1][j] <= limit
        )
        bounds.append((start, end))
        start = end
    bounds.append((start, n))
    return Partition(tuple(bounds), tuple(prefix[e] - prefix[f] for f, e in bounds))


def _plan(items, cost):
    return plan(
        pool_sampler(items), cost, ParallelConfig(gpus=64, dp=4, tp=2, global_batch=256, microbatch_size=4)
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_optimised_plan_equals_plain_plan(seed, monkeypatch):
    """A table pool (column statistics), the numpy partition and the cost caches against a list pool
    (per-record statistics), the scalar recurrence and no caches: the same PlanResult, trial table
    and Eq. 2 gaps included."""
    cost = build_cost_model("qwen25vl-llama3-1b", "a40-paper")
    samples = random_samples(seed, 3000)
    fast = _plan(SampleTable.from_samples(samples), cost)
    monkeypatch.setattr(config_search, "min_max_partition", scalar_partition)
    monkeypatch.setattr(memory, "_cost_memo", lambda cost, key, compute: compute())
    plain = _plan(samples, cost)
    assert fast.b_min == plain.b_min
    assert fast.config == plain.config
    assert [t.to_json() for t in fast.b_min.trials] == [t.to_json() for t in plain.b_min.trials]


@pytest.mark.parametrize("memory_gb", [48.0, 4.0, 1.5])
def test_every_candidate_equals_the_plain_search(memory_gb, monkeypatch):
    """Algorithm 2's whole candidate list (TP and CP searched, memory tight enough that
    recomputation and the largest sample decide) on a table draw, against the plain path."""
    base = build_cost_model("qwen25vl-llama3-1b", "a40-paper")
    cost = replace(base, hardware=replace(base.hardware, device_memory_bytes=memory_gb * 1e9))
    samples = random_samples(5, 400)
    draw = pool_sampler(SampleTable.from_samples(samples))(256, 3)
    searched = ParallelConfig(gpus=32, dp=2, tp=None, cp=None, global_batch=256, microbatch_size=8)
    fast = search_candidates(draw, cost, searched)
    monkeypatch.setattr(config_search, "min_max_partition", scalar_partition)
    monkeypatch.setattr(memory, "_cost_memo", lambda cost, key, compute: compute())
    plain = search_candidates(list(draw), cost, searched)
    assert fast == plain
    assert {r for c in fast for r in c.encoder.recompute + c.llm.recompute} - {"none"}  # memory decided


def test_table_statistics_equal_record_statistics():
    vision = VisionTokenConfig(min_pixels=200_000, max_pixels=400_000)  # both resize branches taken
    samples = [
        SampleMeta(s.id, s.images, s.text_tokens, vision, s.answer_tokens) for s in random_samples(3, 500)
    ]
    samples.append(SampleMeta("tiny", ((5, 7),), 3, vision))
    table = SampleTable.from_samples(samples, vision)
    assert list(table) == samples
    a, b = SampleStats.of(table), SampleStats.of(samples)
    for name in ("enc_x1", "enc_x2", "llm_x1", "llm_x2"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert list(a.ids) == list(b.ids)


@pytest.mark.parametrize("model, hardware", [("qwen25vl-llama3-1b", "a40-paper"), ("tiny", "cpu-tiny")])
def test_column_pricing_is_sample_work_bit_for_bit(model, hardware):
    cost = build_cost_model(model, hardware)
    table = SampleTable.from_samples(random_samples(4, 400))
    draw = pool_sampler(table)(600, 11)
    for tp in (1, 2):
        assert draw_works(draw, cost, tp, numbered=True) == draw_works(list(draw), cost, tp, numbered=True)


def test_memory_check_iterations():
    assert memory_check_iterations(4, 20) == 20  # the paper's setup: every iteration
    assert memory_check_iterations(1, 20) == 20
    assert memory_check_iterations(64, 20) == 2  # 128 replica iterations >= 80
    assert memory_check_iterations(256, 20) == 1
    assert memory_check_iterations(64, 1) == 1
    # with the replica's microbatches: fewer only where a replica iteration holds many more than 32
    assert memory_check_iterations(4, 20, num_microbatches=32) == 20  # the paper's setup, unchanged
    assert memory_check_iterations(64, 20, num_microbatches=32) == 2  # 1M x 1024 GPUs, unchanged
    assert memory_check_iterations(64, 20, num_microbatches=1) == 2
    assert memory_check_iterations(4, 20, num_microbatches=512) == 2  # 64 GPUs at global batch 8192
    assert memory_check_iterations(16, 20, num_microbatches=128) == 2  # 256 GPUs
    assert memory_check_iterations(256, 20, num_microbatches=8) == 1
