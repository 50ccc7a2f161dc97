"""Hypothesis strategies for the assignment tests (shared by test_assignment_properties.py,
test_assignment_quality.py and the two-resource assignment's tests).

``batches()`` draws *hard* cases most of the time: replicas of 10-24 samples whose encoder work
varies within a factor of 4 (so ``K_eff = K`` for K up to 8), and LLM work that mixes short and
long samples (so microbatches differ and deferral pays). One draw in six is an edge case from
``edge_batches()`` (zero work, one sample, K above the sample count). ``hardness()`` measures what
a test asserts about these strategies (test_assignment_quality.py checks the CI fractions)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import strategies as st

from entrain.core.assignment.hierarchical import assign_entrain
from entrain.core.workload.work import SampleWork

__all__ = [
    "batches",
    "edge_batches",
    "hard_batches",
    "seeded_batches",
    "encoder_microbatches",
    "Hardness",
    "hardness",
]

_EDGE_WORK = st.one_of(st.just(0.0), st.floats(0.01, 100.0), st.integers(1, 20).map(float))


def _samples(pairs) -> list[SampleWork]:
    return [SampleWork(f"s{i:03d}", e, m) for i, (e, m) in enumerate(pairs)]


@st.composite
def edge_batches(draw) -> tuple[list[SampleWork], int, int]:
    """(batch, dp, K): any sizes (K may exceed the samples), zero and tiny work included."""
    dp = draw(st.integers(1, 4))
    per_replica = draw(st.integers(1, 14))
    k = draw(st.integers(1, 8))
    pairs = draw(
        st.lists(st.tuples(_EDGE_WORK, _EDGE_WORK), min_size=dp * per_replica, max_size=dp * per_replica)
    )
    return _samples(pairs), dp, k


_ENCODER = st.integers(25, 100).map(float)  # image work within a factor of 4
_LLM = st.one_of(st.integers(1, 30), st.integers(60, 400)).map(float)  # short and long texts


@st.composite
def hard_batches(draw) -> tuple[list[SampleWork], int, int]:
    """(batch, dp, K) with K in 4..8 and 10..24 samples per replica of varied LLM work."""
    dp = draw(st.integers(1, 2))
    k = draw(st.integers(4, 8))
    per_replica = draw(st.integers(max(10, 2 * k), 24))
    n = dp * per_replica
    pairs = draw(st.lists(st.tuples(_ENCODER, _LLM), min_size=n, max_size=n))
    return _samples(pairs), dp, k


@st.composite
def seeded_batches(draw) -> tuple[list[SampleWork], int, int]:
    """Like ``hard_batches`` but the work comes from a seeded generator (log-normal LLM work, the
    shape of real caption lengths), which Hypothesis cannot simplify into equal, easy values."""
    dp = draw(st.integers(1, 2))
    k = draw(st.integers(4, 8))
    per_replica = draw(st.integers(max(10, 2 * k), 24))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    pairs = [
        (float(rng.randint(25, 100)), round(rng.lognormvariate(3.5, 1.0), 3)) for _ in range(dp * per_replica)
    ]
    return _samples(pairs), dp, k


def batches() -> st.SearchStrategy[tuple[list[SampleWork], int, int]]:
    """Mostly hard cases, sometimes edge cases."""
    return st.one_of(seeded_batches(), seeded_batches(), hard_batches(), edge_batches())


@st.composite
def encoder_microbatches(draw, *, min_k: int = 2, max_k: int = 6, max_samples: int = 5):
    """Given encoder microbatches for the deferral oracle: ``K`` in ``min_k..max_k`` lists of 1 to
    ``max_samples`` integer LLM works (a brute force over every pairing and subset stays small)."""
    k = draw(st.integers(min_k, max_k))
    work = st.one_of(st.integers(1, 6), st.integers(10, 40))
    return [draw(st.lists(work.map(float), min_size=1, max_size=max_samples)) for _ in range(k)]


@dataclass(frozen=True)
class Hardness:
    defers: bool
    """Some replica defers at least one sample."""
    k_eff_at_least_4: bool
    """Every replica has ``K_eff >= 4``."""


def hardness(case: tuple[list[SampleWork], int, int]) -> Hardness:
    batch, dp, k = case
    it = assign_entrain(batch, dp, k)
    return Hardness(
        defers=any(r.deferrals for r in it.replicas),
        k_eff_at_least_4=all(r.k_eff >= 4 for r in it.replicas),
    )
