"""benchmarks/layer_bound.py: the whole-layer bound is a true lower bound. The packing bound is never
above the best placement of whole layers (found by enumeration on small instances) and the contiguous
figure is the best contiguous split; on a tiny case no system that keeps one TP group per rank runs
faster than the layer bound, no looped placement (DIP's) faster than the looped figure, and Entrain (whose
layouts split the layers contiguously) never faster than the contiguous figure. (``ceiling.md``, which carries the section, is its JSON rendered: test_ceiling.py.)"""

from __future__ import annotations

import importlib
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def _best_placement(work: list[float], ranks: int) -> float:
    return min(
        max(sum(w for w, r in zip(work, where) if r == k) for k in range(ranks))
        for where in itertools.product(range(ranks), repeat=len(work))
    )


def _best_contiguous(work: list[float], ranks: int) -> float:
    n, best = len(work), float("inf")
    for cuts in itertools.combinations(range(1, n), min(ranks, n) - 1):
        edges = (0, *cuts, n)
        best = min(best, max(sum(work[a:b]) for a, b in itertools.pairwise(edges)))
    return best


@settings(max_examples=60, deadline=None)
@given(
    work=st.lists(st.floats(min_value=0.0, max_value=100.0, allow_nan=False), min_size=1, max_size=7),
    ranks=st.integers(min_value=1, max_value=3),
)
def test_packing_is_below_every_placement_and_contiguous_is_the_best_split(benchmarks_on_path, work, ranks):
    lb = importlib.import_module("layer_bound")
    best = _best_placement(work, ranks)
    packing = lb.packing_bound_ms(work, ranks)
    assert packing <= best * (1 + 1e-9) + 1e-9
    assert packing >= sum(work) / ranks * (1 - 1e-9) and packing >= max(work)
    assert lb.contiguous_ms(work, ranks) == pytest.approx(_best_contiguous(work, ranks), rel=1e-9, abs=1e-9)


def _best_looped(enc: list[float], llm: list[float], ranks: int) -> float:
    def cuts(n):  # non-decreasing boundaries 0 = b0 <= b1 <= ... <= b_ranks = n
        for inner in itertools.combinations_with_replacement(range(n + 1), ranks - 1):
            yield (0, *inner, n)

    return min(
        max(sum(enc[a[r] : a[r + 1]]) + sum(llm[b[r] : b[r + 1]]) for r in range(ranks))
        for a in cuts(len(enc))
        for b in cuts(len(llm))
    )


@settings(max_examples=40, deadline=None)
@given(
    enc=st.lists(st.floats(min_value=0.0, max_value=100.0, allow_nan=False), min_size=1, max_size=4),
    llm=st.lists(st.floats(min_value=0.0, max_value=100.0, allow_nan=False), min_size=1, max_size=4),
    ranks=st.integers(min_value=1, max_value=3),
)
def test_looped_is_the_best_looped_placement_between_packing_and_contiguous(
    benchmarks_on_path, enc, llm, ranks
):
    lb = importlib.import_module("layer_bound")
    looped, runs = lb.looped_split(enc, llm, ranks)
    assert looped == lb.looped_ms(enc, llm, ranks)
    assert looped == pytest.approx(_best_looped(enc, llm, ranks), rel=1e-9, abs=1e-9)
    # the placement returned reaches the figure: each component's runs cover its layers in rank order
    assert len(runs) == ranks
    for k, layers in enumerate((enc, llm)):
        edges = [runs[0][k][0]] + [r[k][1] for r in runs]
        assert edges[0] == 0 and edges[-1] == len(layers)
        assert all(r[k][0] == e for r, e in zip(runs, edges)) and edges == sorted(edges)
    reached = max(sum(enc[e[0] : e[1]]) + sum(llm[m[0] : m[1]]) for e, m in runs)
    assert reached == pytest.approx(looped, rel=1e-9, abs=1e-9)
    assert lb.packing_bound_ms(enc + llm, ranks) <= looped * (1 + 1e-9) + 1e-9
    if ranks <= len(enc) + len(llm):
        assert looped <= lb.contiguous_ms(enc + llm, ranks) * (1 + 1e-9) + 1e-9


def test_packing_counts_the_pigeonhole_not_only_the_mean(benchmarks_on_path):
    """Five equal layers on two ranks: one rank holds three, whatever the placement."""
    lb = importlib.import_module("layer_bound")
    assert lb.packing_bound_ms([1.0] * 5, 2) == 3.0
    assert lb.contiguous_ms([3.0, 1.0, 1.0, 1.0], 2) == 3.0


def test_no_covered_system_is_faster_than_the_layer_bound(benchmarks_on_path):
    ceiling = importlib.import_module("ceiling")
    argv = ["simulate", "--dataset", "synthchartnet", "--model", "qwen25vl-llama3-1b", "--hardware", "a40-paper",
            "--gpus", "8", "--dp", "2", "--tp", "1", "--global-batch", "16", "--microbatch-size", "2",
            "--iterations", "1"]  # fmt: skip
    systems = ["entrain", "disttrain", "dip-greedy", "dflop"]
    case = {"argv": argv, "systems": systems, "lists": ["zoo"]}
    row = ceiling.layers_case("tiny", case, None, True)
    probe = row.pop("looped_probe")  # simulated cases only
    # a ceiling run records each plan's layout: the section on its stored times checks the same premises
    assert ceiling.layers_case("tiny", case, ceiling.run_case("tiny", case), False) == row
    times = {n: v["iteration_time_ms"] for n, v in row["systems"].items()}
    covered = [n for n, v in row["systems"].items() if v["covered"]]
    assert "entrain" in covered and len(covered) >= 2, row["systems"]
    assert row["ranks"] == 4
    assert row["layer_bound_ms"] >= row["bound_ms"]
    assert all(times[n] >= row["layer_bound_ms"] for n in covered), (row["layer_bound_ms"], times)
    assert row["below_layer_bound"] == []
    busiest = {n: v["busiest_rank_ms"] for n, v in row["systems"].items()}
    assert all(busiest[n] >= row["packing_ms"] for n in covered), (row["packing_ms"], busiest)
    runs = [n for n in covered if row["systems"][n]["contiguous"]]
    assert {"entrain", "disttrain"} <= set(runs) and not row["systems"]["dip-greedy"]["contiguous"]
    assert all(busiest[n] >= row["contiguous_ms"] for n in runs), (row["contiguous_ms"], busiest)
    loops = [n for n in covered if row["systems"][n]["looped"]]
    assert set(runs) < set(loops) and "dip-greedy" in loops and row["below_looped"] == []
    assert all(busiest[n] >= row["looped_ms"] for n in loops), (row["looped_ms"], busiest)
    assert row["packing_ms"] <= row["looped_ms"] * (1 + 1e-9) <= row["contiguous_ms"] * (1 + 2e-9)
    assert busiest["entrain"] < 1.25 * row["contiguous_ms"]  # the figure is near what Entrain's split reaches
    assert row["below_contiguous"] == []
    assert times["entrain"] >= row["contiguous_ms"] >= row["packing_ms"] * (1 - 1e-9)
    # the looped probe simulates the placement its figure found: its busiest rank is at the figure (per-call
    # constants on top), never below the looped figure of the same work
    assert probe["entrain_ms"] == times["entrain"]
    assert set(probe["schedules"]) == {"phase", "greedy", "greedy-mem"}
    figure = probe["looped_split_ms"]
    for v in probe["schedules"].values():
        assert figure * (1 - 1e-9) <= v["busiest_rank_ms"] <= 1.02 * figure
        assert v["iteration_time_ms"] >= v["busiest_rank_ms"]
    assert figure == pytest.approx(row["looped_ms"], rel=1e-9)  # one iteration: the same work


def _layout(stages):
    from entrain.core.ir.plan import ComponentLayout, Layout, StageSpec

    specs = tuple(StageSpec(i, c, f, e, r) for i, (c, f, e, r) in enumerate(stages))
    comps = {c: ComponentLayout(1, 1, sum(1 for s in specs if s.component == c)) for c in ("encoder", "llm")}
    return Layout(dp=1, microbatch_size=1, num_microbatches=2, components=comps, stages=specs)


def test_layout_checks_tell_contiguous_looped_and_neither(benchmarks_on_path):
    lb = importlib.import_module("layer_bound")
    shared = _layout([("encoder", 0, 3, 0), ("encoder", 3, 4, 1), ("llm", 0, 2, 1), ("llm", 2, 4, 2)])
    looped = _layout([("encoder", 0, 2, 0), ("encoder", 2, 4, 1), ("llm", 0, 2, 0), ("llm", 2, 4, 1)])
    crossed = _layout([("encoder", 0, 2, 1), ("encoder", 2, 4, 0), ("llm", 0, 2, 0), ("llm", 2, 4, 1)])
    assert lb.contiguous_layout(shared, 4) and lb.looped_layout(shared)
    assert not lb.contiguous_layout(looped, 4) and lb.looped_layout(looped)
    assert not lb.contiguous_layout(crossed, 4) and not lb.looped_layout(crossed)


def test_the_probe_lays_out_the_split_it_is_given(benchmarks_on_path):
    """``looped_probe.looped_layout_of``: rank r holds runs[r]'s encoder and LLM layers, empty runs dropped."""
    probe = importlib.import_module("looped_probe")
    lb = importlib.import_module("layer_bound")
    base = _layout([("encoder", 0, 4, 0), ("llm", 0, 4, 1), ("llm", 4, 5, 2)])
    layout = probe.looped_layout_of(base, [((0, 0), (0, 3)), ((0, 3), (3, 5)), ((3, 4), (5, 5))])
    got = [(s.stage, s.component, s.first_layer, s.end_layer, s.pp_rank) for s in layout.stages]
    assert got == [(0, "encoder", 0, 3, 1), (1, "encoder", 3, 4, 2), (2, "llm", 0, 3, 0), (3, "llm", 3, 5, 1)]
    assert {c: p.pp for c, p in layout.components.items()} == {"encoder": 2, "llm": 2}
    assert layout.ranks_per_replica == 3 and lb.looped_layout(layout) and not lb.contiguous_layout(layout, 4)
