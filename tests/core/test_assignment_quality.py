"""Quality of Entrain's assignment against brute-force or analytic oracles.

The safety properties (each sample once, determinism) live in test_assignment_properties.py; these
tests fail when the assignment gets worse: deferral that misses the optimal pairing makespan, encoder
microbatches outside the list-scheduling bounds, coarse samples piled into one microbatch."""

from __future__ import annotations

import itertools
import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from entrain.core.assignment.deferral import split_overloaded
from entrain.core.assignment.hierarchical import assign_entrain, plan_deferral, replica_assignment
from entrain.core.assignment.stratified import effective_num_microbatches
from entrain.core.workload.work import SampleWork

from .assignment_strategies import batches, encoder_microbatches, hardness


def test_strategies_draw_hard_cases():
    """Under the active profile (CI: derandomized), at least half of the drawn batches defer and at
    least half have ``K_eff >= 4`` in every replica."""
    seen = []

    @settings(database=None)
    @given(batches())
    def draw(case):
        seen.append(hardness(case))

    draw()
    assert len(seen) >= 20
    defers = sum(h.defers for h in seen) / len(seen)
    k_eff = sum(h.k_eff_at_least_4 for h in seen) / len(seen)
    assert defers >= 0.5, f"only {defers:.0%} of {len(seen)} examples defer"
    assert k_eff >= 0.5, f"only {k_eff:.0%} of {len(seen)} examples have K_eff >= 4"


def _best_pair(ol: list[float], w_ul: float) -> float:
    """The smallest max(w_ol - d, w_ul + d) over every subset of ``ol`` (sum d <= w_ol - w_ul)."""
    w_ol = sum(ol)
    return min(
        max(w_ol - d, w_ul + d)
        for r in range(len(ol) + 1)
        for sub in itertools.combinations(ol, r)
        if (d := sum(sub)) <= w_ol - w_ul
    )


def _brute_force_makespan(mbs: list[list[float]]) -> tuple[float, float]:
    """(best pair makespan, best overall makespan) over every OL -> UL pairing and every deferred subset."""
    loads = [sum(mb) for mb in mbs]
    ol, ul, median = split_overloaded(loads)
    pairs = min(
        (
            max((_best_pair(mbs[i], loads[j]) for i, j in zip(ol, perm)), default=0.0)
            for perm in itertools.permutations(ul)
        ),
    )
    return pairs, max(pairs, loads[median] if median is not None else 0.0)


@given(encoder_microbatches())
def test_deferral_makespan_equals_brute_force_optimum(mbs):
    """Integer work with buckets finer than a unit over ``n + 1`` samples makes the subset-sum DP
    exact, so ``T*`` and the LLM makespan must equal the exhaustive optimum of the paper's pairing."""
    encoder_mbs = [[SampleWork(f"m{m}s{k}", 1.0, w) for k, w in enumerate(mb)] for m, mb in enumerate(mbs)]
    exact_buckets = (max(len(mb) for mb in mbs) + 1) * int(max(sum(mb) for mb in mbs)) + 1
    plan = plan_deferral(
        [[s.id for s in mb] for mb in encoder_mbs], [[s.llm for s in mb] for mb in encoder_mbs], exact_buckets
    )
    rep = replica_assignment(encoder_mbs, exact_buckets)
    pairs, overall = _brute_force_makespan(mbs)
    assert plan.t_star == pairs
    paired = [m for ol, ul, _ in plan.pairs for m in (ol, ul)]
    assert max((rep.llm_work[m] for m in paired), default=0.0) == pairs
    assert max(rep.llm_work) == overall


def _optimal_makespan(works: list[float], k: int) -> float:
    """Exact min-max partition of ``works`` into ``k`` bins (branch and bound, small inputs)."""
    works = sorted(works, reverse=True)
    best = [sum(works)]
    loads = [0.0] * k

    def place(i: int) -> None:
        if i == len(works):
            best[0] = min(best[0], max(loads))
            return
        tried = set()
        for b in range(k):
            if loads[b] in tried or loads[b] + works[i] >= best[0]:
                continue
            tried.add(loads[b])
            loads[b] += works[i]
            place(i + 1)
            loads[b] -= works[i]

    place(0)
    return best[0]


@given(batches())
def test_stratified_encoder_balance_within_list_scheduling_bound(case):
    """Graham's list-scheduling bound holds for any list order, so also for coarse-then-fine:
    ``max <= sum/K_eff + (1 - 1/K_eff) * p_max``; and ``K_eff`` follows its definition."""
    batch, dp, k = case
    enc_of = {s.id: s.encoder for s in batch}
    for r in assign_entrain(batch, dp, k).replicas:
        works = [enc_of[s] for s in r.sample_ids]
        assert r.k_eff == effective_num_microbatches(works, k)
        total, p_max, kk = math.fsum(works), max(works), r.k_eff
        bound = total / kk + (1 - 1 / kk) * p_max
        assert max(r.encoder_work) <= bound * (1 + 1e-9)


_SMALL_ENC = st.integers(1, 30).map(float)
_SMALL_LLM = st.one_of(st.integers(1, 10), st.integers(40, 90)).map(float)


@given(st.integers(2, 4), st.lists(st.tuples(_SMALL_ENC, _SMALL_LLM), min_size=6, max_size=13))
def test_coarse_set_is_lpt_balanced_against_brute_force(k, pairs):
    """The coarse set (LLM work above the median) is placed first, in encoder-descending order, on
    empty microbatches: that is LPT, so its encoder loads are within ``4/3 - 1/(3K)`` of the optimal
    partition of the coarse samples alone (Graham 1969)."""
    batch = [SampleWork(f"s{i:02d}", e, m) for i, (e, m) in enumerate(pairs)]
    (rep,) = assign_entrain(batch, 1, k).replicas
    of = {s.id: s for s in batch}
    llms = sorted(s.llm for s in batch)
    median = (llms[(len(llms) - 1) // 2] + llms[len(llms) // 2]) / 2
    coarse = [s for s in batch if s.llm > median]
    assume(coarse)
    coarse_loads = [
        math.fsum(of[s].encoder for s in mb if of[s].llm > median) for mb in rep.encoder_microbatches
    ]
    opt = _optimal_makespan([s.encoder for s in coarse], rep.k_eff)
    kk = rep.k_eff
    assert max(coarse_loads) <= (4 / 3 - 1 / (3 * kk)) * opt * (1 + 1e-9)


@st.composite
def same_size_images(draw):
    """One replica whose images all cost the same (one resolution) and whose texts differ."""
    k = draw(st.integers(2, 8))
    n = draw(st.integers(2 * k, 24))
    llm = draw(
        st.lists(st.one_of(st.integers(1, 30), st.integers(60, 400)).map(float), min_size=n, max_size=n)
    )
    return [SampleWork(f"s{i:03d}", 50.0, w) for i, w in enumerate(llm)], k


@given(same_size_images())
def test_coarse_samples_spread_over_microbatches(case):
    """With equal encoder work the coarse/fine split deals the LLM-heavy samples round-robin: every
    microbatch holds ``floor(c/K)`` or ``ceil(c/K)`` of the ``c`` coarse samples, so its LLM load is
    at most ``ceil(c/K)`` heaviest plus ``ceil(f/K)`` median-or-lighter samples."""
    batch, k = case
    (rep,) = assign_entrain(batch, 1, k).replicas
    llm_of = {s.id: s.llm for s in batch}
    llms = sorted(llm_of.values())
    median = (llms[(len(llms) - 1) // 2] + llms[len(llms) // 2]) / 2
    c = sum(w > median for w in llms)
    kk = rep.k_eff
    counts = [sum(llm_of[s] > median for s in mb) for mb in rep.encoder_microbatches]
    assert min(counts) >= c // kk and max(counts) <= -(-c // kk), counts
    bound = -(-c // kk) * llms[-1] + -(-(len(llms) - c) // kk) * median
    pre_deferral = [math.fsum(llm_of[s] for s in mb) for mb in rep.encoder_microbatches]
    assert max(pre_deferral) <= bound * (1 + 1e-9)
