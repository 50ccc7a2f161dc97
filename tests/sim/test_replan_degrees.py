"""A re-plan that may also change DP, TP and the microbatch size (``ReplanSettings.degrees``): the
re-planner's finalists (``entrain.sim.adaptive.degrees_replanner``: the best split at the run's degrees,
the best at other degrees) and the monitor's choice among them net of each one's switch cost, recorded
(``entrain.sim.drift.ReplanChoice``)."""

from __future__ import annotations

import dataclasses
import math
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.cli.main import build_parser
from entrain.config import RunConfig
from entrain.core.planning.setups import system_setups
from entrain.core.workload.work import SampleWork
from entrain.data import sampling
from entrain.sim import drift
from entrain.sim.drift import DriftMonitor, ReplanSettings, allocation, replan_cost_ms


def _req(dataset: str, flags: str = ""):
    args = build_parser().parse_args(
        f"simulate --model tiny --dataset {dataset} --gpus 4 --global-batch 16 --microbatch-size 2 {flags}".split()
    )
    config = RunConfig.from_args(args)
    cost = config.model.cost_model()
    return cost, dataclasses.replace(config.config_request(), model=cost.model)


@pytest.fixture(scope="module")
def tiny():
    """Three tiny-model Entrain setups on 4 GPUs that differ in DP, TP and microbatch size: dp 2 mb 2 (the
    run's), dp 1 tp 2 mb 2 (half the largest checkpoint shard: a cheaper switch), dp 2 mb 1."""
    cost, req = _req("chartqa")
    sampler = sampling.dataset_sampler("chartqa", 0)

    def setup(name, **kw):
        got = system_setups(["entrain"], dataclasses.replace(req, **kw), cost, sampler)["entrain"]
        return dataclasses.replace(got, source=name)

    return cost, [setup("run", dp=2), setup("tp2", dp=1, tp=2), setup("mb1", dp=2, microbatch_size=1)]


def _batch(encoder_ms: float, n: int = 8) -> list[SampleWork]:
    return [SampleWork(f"s{i}", encoder_ms, 10.0) for i in range(n)]


@settings(deadline=None, max_examples=40)
@given(
    times=st.lists(st.floats(1.0, 1e4), min_size=3, max_size=3),
    restart_ms=st.floats(0.0, 1e6),
    total=st.integers(2, 400),
    fits=st.lists(st.booleans(), min_size=2, max_size=2),
    bandwidth=st.sampled_from([1e6, 1e2, 1e-2]),
)
def test_the_monitor_takes_the_finalist_cheapest_net_of_its_switch_and_records_it(
    tiny, times, restart_ms, total, fits, bandwidth
):
    """Whatever the window times and the restart's price: the finalist taken is the one with the lowest
    window time x iterations left + its own switch cost (checkpoint, restart, reshard from the split in
    use); the predicted gain is that finalist's; and it is never lower than the first finalist's alone
    (the split at the run's degrees: what a re-plan without ``degrees`` would have weighed)."""
    cost, (run, *finalists) = tiny
    ms = {
        "run": times[0],
        "tp2": times[1] if fits[0] else float("inf"),
        "mb1": times[2] if fits[1] else float("inf"),
    }

    def monitor(candidates):
        return DriftMonitor(
            run, _batch(10), cost, replanner=lambda batches: candidates, window_time=lambda s, b: ms[s.source],
            total_iterations=total, settings=ReplanSettings(window=1, restart_ms=restart_ms, threshold=-math.inf),
        )  # fmt: skip

    both, first = monitor(finalists), monitor(finalists[:1])
    with mock.patch.object(drift, "STORAGE_BYTES_PER_MS", bandwidth):  # shards that cost more or less
        both.observe(0, _batch(40))
        first.observe(0, _batch(40))
        switch = [replan_cost_ms(run.layout, f.layout, cost, restart_ms) for f in finalists]
    left = total - 1
    net = [ms[f.source] * left + s for f, s in zip(finalists, switch)]
    (choice,) = both.choices
    assert [f["window_ms"] for f in choice.finalists] == [ms[f.source] for f in finalists]
    assert [f["switch_ms"] for f in choice.finalists] == switch
    assert [f["microbatch_size"] for f in choice.finalists] == [2, 1]
    assert [f["allocation"] for f in choice.finalists] == [allocation(f.layout) for f in finalists]
    assert choice.current_ms == ms["run"] and choice.left == left
    fitting = [i for i in range(2) if fits[i]]
    if not fitting:
        assert choice.chosen is None and not both.replans
        return
    want = min(fitting, key=lambda i: net[i])
    assert choice.chosen == want
    (fired,) = both.replans  # threshold -inf: every evaluation with a finalist that fits fires
    assert both.setup is finalists[want]
    assert fired.predicted_gain == pytest.approx((ms["run"] * left - net[want]) / (ms["run"] * left))
    if fits[0]:
        assert fired.predicted_gain >= first.history[0].predicted_gain - 1e-12


def test_a_single_finalist_is_the_re_plan_without_degrees(tiny):
    """A re-planner that returns one setup (no ``degrees``) is weighed as before: its gain, its record."""
    cost, (run, new, _) = tiny
    monitor = DriftMonitor(
        run, _batch(10), cost, replanner=lambda b: new, window_time=lambda s, b: {"run": 1e6, "tp2": 5e5}[s.source],
        total_iterations=10, settings=ReplanSettings(window=1, restart_ms=0.0),
    )  # fmt: skip
    assert monitor.observe(0, _batch(40)) is new
    want = ((1e6 - 5e5) * 9 - replan_cost_ms(run.layout, new.layout, cost, 0.0)) / (1e6 * 9)
    assert monitor.replans[0].predicted_gain == pytest.approx(want)
    assert monitor.choices[0].chosen == 0 and len(monitor.choices[0].finalists) == 1


def test_degree_candidates_are_other_dp_tp_microbatch_sizes_of_the_same_run():
    """Each candidate: Algorithm 2's best fitting configuration at a (DP, TP, microbatch size) other than
    the split in use's, on the run's GPUs and global batch, one TP for both components, the schedule
    options kept; the best by Eq. 2 first, no triple twice."""
    from entrain.data.generators import generate_samples
    from entrain.sim.adaptive import degree_candidates

    cost, req = _req("docvqa", "--dp 2")
    planned = system_setups(["entrain"], req, cost, sampling.dataset_sampler("chartqa", 0))["entrain"]
    items = generate_samples("docvqa", 64, 0)
    got = degree_candidates(planned, items, cost, req, top=100)
    triples = [(c.layout.dp, c.layout.components["encoder"].tp, c.layout.microbatch_size) for c in got]
    run = (planned.layout.dp, planned.layout.components["encoder"].tp, planned.layout.microbatch_size)
    assert got and run not in triples and len(set(triples)) == len(triples)
    assert {t[0] for t in triples} > {2} and {t[2] for t in triples} > {2}  # DP and microbatch size move
    for c in got:
        lay = c.layout
        assert lay.global_batch == 16 and lay.dp * lay.ranks_per_replica <= 4 and c.config.memory_ok
        assert lay.components["encoder"].tp == lay.components["llm"].tp
        assert c.options == planned.options
    times = [c.config.predicted_iteration_time_ms for c in got]
    assert times == sorted(times)
    assert [c.layout for c in degree_candidates(planned, items, cost, req, top=2)] == [
        c.layout for c in got[:2]
    ]


def test_a_drifted_window_may_re_plan_to_other_degrees_and_records_it():
    """End to end on the tiny model: planned on chartqa at dp 2, a docvqa window; the re-planner with
    ``degrees`` hands the monitor the best split at the run's degrees and the best at other degrees, the
    simulator's window times decide net of each one's switch cost, and the record says which was taken."""
    from entrain.core.costs.table_work import draw_works
    from entrain.data.generators import generate_samples
    from entrain.sim.adaptive import window_replanner, window_time

    cost, req = _req("chartqa", "--dp 2")
    start = system_setups(["entrain"], req, cost, sampling.dataset_sampler("chartqa", 0))["entrain"]
    items = generate_samples("docvqa", 32, 1)
    window = [draw_works(items[i : i + 16], cost, 1, 1, numbered=True) for i in (0, 16)]
    judge = window_time("entrain", cost)
    finalists = window_replanner("entrain", req, cost, judge, degrees=True)(window)
    assert len(finalists) == 2
    degrees = [(f.layout.dp, f.layout.components["encoder"].tp, f.layout.microbatch_size) for f in finalists]
    assert degrees[0] == (2, 1, 2) and degrees[1] != degrees[0]
    monitor = DriftMonitor(
        start, [w for b in window for w in b], cost, replanner=lambda b: finalists, window_time=judge,
        total_iterations=1000, settings=ReplanSettings(window=2, trigger=0.0),
    )  # fmt: skip
    assert monitor.observe(0, window[0]) is None
    got = monitor.observe(1, window[1])
    (choice,) = monitor.choices
    assert [f["window_ms"] for f in choice.finalists] == [judge(f, window) for f in finalists]
    # measured: in use 107.9 s, the split at dp 2 105.5 s, dp 1 tp 2 microbatch 1 97.6 s (one-minute switches)
    assert (
        choice.chosen
        == 1
        == min((0, 1), key=lambda i: judge(finalists[i], window) * 998 + choice.finalists[i]["switch_ms"])
    )
    assert got is finalists[1] and monitor.replans[0].new_allocation == choice.finalists[1]["allocation"]
    assert (got.layout.dp, got.layout.components["encoder"].tp, got.layout.microbatch_size) != (2, 1, 2)
    assert choice.finalists[1]["microbatch_size"] == got.layout.microbatch_size
