"""Built-in generators: calibration bounds (``entrain/data/calibration/bounds.json``), determinism,
slicing consistency and the ``skewed`` contract."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from entrain.core.errors import ConfigError
from entrain.data.calibration import (
    _relation_datasets,
    disttrain_microbatch_work,
    load_bounds,
    measure_for_bounds,
)
from entrain.data.generators import (
    BLOCK_SIZE,
    DATASETS,
    canonical_name,
    generate_arrays,
    generate_samples,
    random_samples,
)
from entrain.data.zoo_generators import ZOO

BOUNDS = load_bounds()


def measured(dataset: str, entry: dict | None = None) -> dict[str, float]:
    """One 10k-sample draw per dataset (memoised): token stats and work priced with ``entry``'s setup."""
    return measure_for_bounds(dataset, BOUNDS, entry)


def _bound_id(b: dict) -> str:
    return f"{b['dataset']}:{b['stat']}[{b['min']},{b['max']}]"


HOLDING = [b for b in BOUNDS["bounds"] if b["status"] == "holds"]


@pytest.mark.parametrize("bound", HOLDING, ids=[_bound_id(b) for b in HOLDING])
def test_calibration_bound_holds(bound):
    value = measured(bound["dataset"], bound)[bound["stat"]]
    assert bound["min"] <= value <= bound["max"], f"{value} outside bound; source: {bound['source']}"


def test_every_bound_has_source_and_deviations_are_explained():
    assert BOUNDS["draw"]["num_samples"] >= 10_000
    for b in BOUNDS["bounds"]:
        assert b["dataset"] in DATASETS and b["source"] and b["min"] <= b["max"]
        assert b["status"] in ("holds", "deviates")
        if b["status"] == "deviates":
            assert b["note"] and "measured" in b and "target" in b
    for r in BOUNDS["relations"]:
        assert r["source"]


@pytest.mark.parametrize(
    "rel",
    BOUNDS["relations"],
    ids=[
        f"{r['kind']}:{r['stat']}{':' + r['setup']['hardware'] if 'setup' in r else ''}"
        for r in BOUNDS["relations"]
    ],
)
def test_calibration_relation_holds(rel):
    values = {d: measured(d, rel)[rel["stat"]] for d in _relation_datasets(rel)}
    if rel["kind"] == "descending":
        seq = [values[d] for d in rel["datasets"]]
        assert seq == sorted(seq, reverse=True), values
    elif rel["kind"] == "largest":
        assert values[rel["dataset"]] > max(values[d] for d in rel["among"]), values
    elif rel["kind"] == "smallest":
        assert values[rel["dataset"]] < min(values[d] for d in rel["among"]), values
    else:
        assert rel["kind"] == "ratio"
        ratio = values[rel["numerator"]] / values[rel["denominator"]]
        assert rel["min"] <= ratio <= rel["max"], values


def test_synthchartnet_data_order_is_correlated_but_random_draws_are_not():
    ordered = np.array([s.vit_patches for s in generate_samples("synthchartnet", 4096, seed=1)], dtype=float)
    shuffled = np.array([s.vit_patches for s in random_samples("synthchartnet", 1024, seed=1)], dtype=float)

    def lag1(x):
        return np.corrcoef(x[:-1], x[1:])[0, 1]

    assert lag1(ordered) > 0.6
    assert abs(lag1(shuffled)) < 0.15


@pytest.mark.parametrize("name", DATASETS)
def test_deterministic_and_seed_dependent(name):
    a = generate_samples(name, 300, seed=7)
    assert a == generate_samples(name, 300, seed=7)
    assert [s.images for s in a] == [s.images for s in generate_samples(name, 300, seed=7)]
    assert [s.id for s in a] == [f"{name}-7-{i}" for i in range(300)]
    other = generate_samples(name, 300, seed=8)
    assert [(s.images, s.text_tokens) for s in a] != [(s.images, s.text_tokens) for s in other]
    assert all(s.text_tokens > 0 for s in a)
    if name not in ZOO and name != "curriculum":  # the zoo and the curriculum have several images a sample
        assert all(len(s.images) == 1 and s.vit_patches > 0 for s in a)


@given(
    name=st.sampled_from(DATASETS),
    start=st.integers(0, 3 * BLOCK_SIZE),
    num=st.integers(0, 2 * BLOCK_SIZE),
)
def test_slicing_consistent(name, start, num):
    full = generate_arrays(name, 5 * BLOCK_SIZE + 1, seed=3)
    part = generate_arrays(name, num, seed=3, start=start)
    assert part.ids() == full.ids()[start : start + num]
    for col in ("text_tokens", "image_counts"):
        assert np.array_equal(getattr(part, col), getattr(full, col)[start : start + num])
    assert part.images() == full.images()[start : start + num]


def test_random_samples_match_their_indices():
    picks = random_samples("chartqa", 50, seed=4, population=5000)
    assert len({s.id for s in picks}) == 50
    for s in picks[:10]:
        index = int(s.id.rsplit("-", 1)[1])
        (same,) = generate_samples("chartqa", 1, seed=4, start=index)
        assert same == s and same.images == s.images


def test_skewed_follows_the_contract():
    a = generate_arrays("skewed", 10_000, seed=0)
    sides = np.concatenate([a.heights, a.widths])
    assert sides.min() >= 112 and sides.max() <= 896
    # log-uniform: the log side is uniform, so its median is the geometric mean sqrt(112 * 896)
    assert np.median(sides) == pytest.approx(np.sqrt(112 * 896), rel=0.05)
    assert np.mean(sides < 224) == pytest.approx(1 / 3, abs=0.02)  # log2 spans 3 octaves
    assert a.text_tokens.min() >= 16 and a.text_tokens.max() <= 256
    assert np.median(a.text_tokens) == pytest.approx(64, rel=0.08)


def test_names_and_errors():
    assert canonical_name("llava_instruct_150k") == "llava150k"
    assert generate_samples("llava_instruct_150k", 2, 0) == generate_samples("llava150k", 2, 0)
    with pytest.raises(ConfigError, match="synthchartnet, chartqa, cocoqa, llava150k"):
        generate_samples("coco", 1, 0)
    with pytest.raises(ConfigError):
        generate_samples("cocoqa", 1, -1)


def test_disttrain_microbatches_are_lpt_with_equal_counts():
    work = np.array([10, 1, 1, 1, 9, 1, 1, 1, 8, 1, 1, 1, 7, 1, 1, 1], dtype=float)
    per_replica = disttrain_microbatch_work(work, dp=4, microbatch_size=4)
    assert per_replica.shape == (1, 4)
    assert sorted(per_replica[0]) == [10.0, 11.0, 12.0, 13.0]
    assert per_replica.sum() == work.sum()
