"""The multi-encoder assignment (``assignment.multi_encoder``): each sample once, with one encoder
exactly the paper's stratified assignment, every encoder's microbatch load within the vector list-
scheduling bound, deferral moving LLM work only, and (what it is for) audio and vision loads both
balanced where stratifying on one encoder leaves the other piled up."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.assignment.dp_split import split_dp
from entrain.core.assignment.multi_encoder import (
    EncoderWork,
    assign_multi_encoder,
    assign_replica_multi_encoder,
    microbatch_loads,
    multi_encoder_assign,
    multi_encoder_k,
    multi_encoder_lpt,
    split_dp_multi_encoder,
)
from entrain.core.assignment.stratified import stratified_assign
from entrain.core.errors import ConfigError
from entrain.core.workload.work import SampleWork

FEW = settings(max_examples=40, deadline=None)
_WORK = st.one_of(st.just(0.0), st.floats(0.01, 100.0), st.integers(1, 50).map(float))


@st.composite
def replicas(draw, n_encoders=None):
    """(samples, K, weights): 1-30 samples with 1-3 encoders (some samples without a modality)."""
    n_enc = n_encoders or draw(st.integers(1, 3))
    n = draw(st.integers(1, 30))
    rows = draw(st.lists(st.tuples(st.tuples(*[_WORK] * n_enc), _WORK), min_size=n, max_size=n))
    k = draw(st.integers(1, 8))
    weights = draw(st.one_of(st.none(), st.tuples(*[st.floats(0.1, 4.0)] * n_enc)))
    return [EncoderWork(f"s{i:03d}", enc, llm) for i, (enc, llm) in enumerate(rows)], k, weights


@FEW
@given(replicas())
def test_every_sample_once_in_k_eff_microbatches(case):
    samples, k, weights = case
    bins = multi_encoder_assign(samples, k, weights)
    assert len(bins) == multi_encoder_k(samples, k, weights) <= k
    assert sorted(s.id for mb in bins for s in mb) == sorted(s.id for s in samples)
    if len(samples) >= len(bins):
        assert all(bins)


@FEW
@given(replicas(n_encoders=1))
def test_one_encoder_is_the_stratified_assignment(case):
    samples, k, _ = case
    ours = multi_encoder_assign(samples, k)
    paper = stratified_assign([SampleWork(s.id, s.encoders[0], s.llm) for s in samples], k)
    assert [[s.id for s in mb] for mb in ours] == [[s.id for s in mb] for mb in paper]


@FEW
@given(replicas())
def test_every_encoder_load_within_the_list_scheduling_bound(case):
    samples, k, weights = case
    w = np.ones(len(samples[0].encoders)) if weights is None else np.asarray(weights)
    bins = multi_encoder_assign(samples, k, weights)
    loads = microbatch_loads(bins) * w
    work = np.array([s.encoders for s in samples]) * w
    bound = work.sum() / len(bins) + work.max(axis=1).max()
    assert loads.max() <= bound * (1 + 1e-9) + 1e-9


@FEW
@given(replicas())
def test_deferral_moves_llm_work_only(case):
    samples, k, weights = case
    got = assign_replica_multi_encoder(samples, k, weights)
    bins = multi_encoder_assign(samples, k, weights)
    rep = got.replica
    assert rep.encoder_microbatches == tuple(tuple(s.id for s in mb) for mb in bins)
    assert np.allclose(
        np.array(got.encoder_loads).reshape(microbatch_loads(bins).shape), microbatch_loads(bins)
    )
    assert sorted(s for mb in rep.llm_microbatches for s in mb) == sorted(s.id for s in samples)
    llm = {s.id: s.llm for s in samples}
    assert math.isclose(sum(rep.llm_work), math.fsum(llm.values()), rel_tol=1e-9, abs_tol=1e-9)


@st.composite
def global_batches(draw, n_encoders=None):
    """(batch, dp, K, weights): ``dp`` replicas' worth of samples."""
    dp = draw(st.integers(1, 4))
    samples, k, weights = draw(replicas(n_encoders))
    keep = len(samples) - len(samples) % dp
    if keep == 0:
        samples, keep = samples * dp, dp
        samples = [EncoderWork(f"{s.id}-{i}", s.encoders, s.llm) for i, s in enumerate(samples)]
    return samples[:keep], dp, k, weights


@FEW
@given(global_batches())
def test_global_batch_every_sample_once_b_over_dp_each(case):
    batch, dp, k, weights = case
    got = assign_multi_encoder(batch, dp, k, weights)
    assert len(got) == dp and all(len(a.replica.sample_ids) == len(batch) // dp for a in got)
    assert sorted(i for a in got for i in a.replica.sample_ids) == sorted(s.id for s in batch)


@FEW
@given(global_batches(n_encoders=1))
def test_one_encoder_dp_split_is_the_papers(case):
    batch, dp, _, _ = case
    ours = split_dp_multi_encoder(batch, dp)
    paper = split_dp([SampleWork(s.id, s.encoders[0], s.llm) for s in batch], dp)
    assert [[s.id for s in r] for r in ours] == [[s.id for s in r] for r in paper]


def _audio_or_image(n: int = 48) -> list[EncoderWork]:
    """Half the samples an image (vision work, no audio), half a clip (audio work, no image)."""
    out = []
    for i in range(n):
        big = 20.0 + (i * 7) % 30
        enc = (big, 0.0) if i % 2 else (0.0, big)
        out.append(EncoderWork(f"s{i:03d}", enc, 10.0 + (i * 13) % 40))
    return out


def test_both_encoders_balanced_where_one_encoder_stratifying_piles_up_the_other():
    samples = _audio_or_image()
    k = 6
    ours = microbatch_loads(multi_encoder_lpt(samples, k))
    vision_only = stratified_assign([SampleWork(s.id, s.encoders[0], s.llm) for s in samples], k)
    by_id = {s.id: s for s in samples}
    theirs = microbatch_loads([[by_id[s.id] for s in mb] for mb in vision_only])
    ideal = np.array([s.encoders for s in samples]).sum(axis=0) / k
    assert ours[:, 1].max() <= 1.2 * ideal[1] and ours[:, 0].max() <= 1.2 * ideal[0]
    assert theirs[:, 1].max() > 1.5 * ideal[1]  # the audio pile-up the vector LPT removes


def test_bad_input_is_named():
    with pytest.raises(ConfigError, match="s1"):
        EncoderWork("s1", (1.0, -2.0), 1.0)
    with pytest.raises(ConfigError, match="different numbers of encoders"):
        multi_encoder_assign([EncoderWork("a", (1.0,), 1.0), EncoderWork("b", (1.0, 2.0), 1.0)], 2)
    with pytest.raises(ConfigError, match="weights"):
        multi_encoder_assign([EncoderWork("a", (1.0, 2.0), 1.0)], 2, weights=(1.0,))
