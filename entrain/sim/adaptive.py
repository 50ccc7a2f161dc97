"""A system re-planned on drift in simulation (``simulate --replan auto``): the drift monitor
(``entrain.sim.drift``) watches the iterations in order; each re-plan starts a new segment on the new
setup. Every segment is deployed (the simulated memory check) and simulated on its own batches, as
``simulate`` does a static system on all of them, and the segments' metrics are joined."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.sampler import SampleStats, pool_sampler
from entrain.core.errors import ConfigError
from entrain.core.planning.config_search import StaticConfig, search_candidates
from entrain.core.planning.setups import ConfigRequest, SystemSetup, system_setups
from entrain.core.systems import systems_where
from entrain.core.workload.work import SampleWork
from entrain.sim.choose import candidate_judge, judged_ms, planner_draws
from entrain.sim.drift import DriftMonitor, Replanner, ReplanSettings, WindowTime
from entrain.sim.memory_fit import deploy, from_peaks
from entrain.sim.metrics import SystemMetrics
from entrain.sim.replica_sample import JUDGE_REPLICAS
from entrain.sim.run import SystemRun, run_system

__all__ = [
    "REPLAN_SYSTEMS",
    "AdaptiveRun",
    "window_replanner",
    "degrees_replanner",
    "degree_candidates",
    "window_time",
    "WindowJudge",
    "fastest",
    "monitor_for",
    "adaptive_deploy",
]

REPLAN_SYSTEMS = systems_where("replannable")
"""Systems ``--replan auto`` re-plans (``SystemSpec.replannable``)."""


@dataclass
class AdaptiveRun:
    setups: list[SystemSetup]
    """Each segment's deployed setup, in order."""
    run: SystemRun
    """The first segment's run, with the joined metrics of all segments."""
    monitor: DriftMonitor


def window_replanner(
    system: str, req: ConfigRequest, cost: CostModel, judge: WindowJudge, *, degrees: bool = False
) -> Replanner:
    """The best split for the window: Algorithms 1-2 (and Entrain's extensions, the layout judged by
    simulation) on the window's samples (the planner's population, ``pool_sampler``), against Algorithm
    2's best configuration for each other encoder/LLM GPU budget of a replica on the same samples
    (``split_candidates``); the one ``judge`` puts fastest on the window's batches (``fastest``), from
    the start of its memory check that got there (``WindowJudge.start``). ``degrees``
    (``ReplanSettings.degrees``): also the best at other DP / TP / microbatch size (``degrees_replanner``).
    """

    def replan(batches: list[Sequence[SampleWork]]) -> SystemSetup:
        items = [w.meta if w.meta is not None else w for b in batches for w in b]
        sampler = pool_sampler(items)
        planned = system_setups([system], req, cost, sampler, candidate_judge(sampler, cost, req))[system]
        candidates = [planned, *split_candidates(planned, items, cost, req)]
        return judge.start(fastest(candidates, batches, judge, judge.bound), batches)

    return degrees_replanner(replan, req, cost, judge) if degrees else replan


def fastest(
    candidates: Sequence[SystemSetup],
    batches: list[Sequence[SampleWork]],
    time_ms: WindowTime,
    bound_ms: WindowTime | None = None,
) -> SystemSetup:
    """The candidate with the lowest ``time_ms`` on ``batches`` (ties: the earlier). ``bound_ms``, a
    lower bound of ``time_ms`` (``WindowJudge.bound``), orders the candidates, and one whose bound is
    not below the best time so far is not judged."""
    if bound_ms is None:
        return min(candidates, key=lambda c: time_ms(c, batches))
    best, best_ms = candidates[0], math.inf
    for c in sorted(candidates, key=lambda c: bound_ms(c, batches)):
        if bound_ms(c, batches) >= best_ms:
            break
        ms = time_ms(c, batches)
        if ms < best_ms:
            best, best_ms = c, ms
    return best


def split_candidates(
    setup: SystemSetup, items: Sequence, cost: CostModel, req: ConfigRequest
) -> list[SystemSetup]:
    """For each encoder GPU budget of a replica (multiples of the encoder's TP x CP) other than the
    planned one, Algorithm 2's best configuration that fits memory on ``items``, with ``setup``'s
    DP and schedule options (disjoint stages)."""
    layout = setup.layout
    enc = layout.components["encoder"]
    per_replica, unit = req.gpus // layout.dp, enc.tp * enc.cp
    planned = enc.tp * enc.cp * enc.pp
    stats = SampleStats.of(items)
    parallel = replace(req.parallel, dp=layout.dp, tp=enc.tp, cp=enc.cp)
    out = []
    for budget in range(unit, per_replica, unit):
        if budget == planned:
            continue
        found = search_candidates(stats, cost, parallel, allocation=(budget, per_replica - budget))
        fits = [c for c in found if c.memory_ok]
        if fits:
            source = f"Algorithm 2 with {budget} of {per_replica} GPUs a replica for the encoder (window)"
            out.append(replace(setup, layout=fits[0].to_layout(), config=fits[0], source=source))
    return out


DEGREE_TPS = (1, 2, 4, 8)
"""The TP degrees a re-plan with ``ReplanSettings.degrees`` tries (one for both components: the runtime
takes one ``--tp``), where the cost model prices them."""
DEGREE_MICROBATCH_SIZES = (1, 2, 4, 8)
"""The microbatch sizes it tries (dividing the global batch over DP)."""
DEGREE_FINALISTS = 8
"""Of the other (DP, TP, microbatch size) triples' Algorithm 2 configurations on the window, how many,
the best by Eq. 2, the simulator judges (in the order of their time as planned, pruned by it:
``fastest``). Eq. 2 ranks a configuration on its mean microbatch: measured on 3B at 64 GPUs (DP 4, TP 2,
microbatch size 4, a docvqa window of 2 batches), its 5 best were microbatch size 1 on one or two
stages a component, 160-196 s once the memory check added the recomputation heavier samples need, and
its 6th, DP 4 microbatch size 2, 182 s: the 3 best would have missed it."""


def degree_candidates(
    setup: SystemSetup, items: Sequence, cost: CostModel, req: ConfigRequest, top: int = DEGREE_FINALISTS
) -> list[SystemSetup]:
    """For each (DP, TP, microbatch size) other than ``setup``'s, on the run's GPUs and global batch (DP
    any degree leaving at least 2 GPUs a replica, TP ``DEGREE_TPS`` for both components at ``setup``'s CP,
    microbatch sizes ``DEGREE_MICROBATCH_SIZES``), Algorithm 2's best configuration that fits memory on
    ``items`` (its own split of the replica's GPUs); the ``top`` of them with the lowest Eq. 2 time (ties:
    ``StaticConfig.sort_key``), with ``setup``'s schedule options (disjoint stages)."""
    layout = setup.layout
    enc = layout.components["encoder"]
    current = (layout.dp, enc.tp, layout.microbatch_size)
    stats = SampleStats.of(items)
    best: dict[tuple[int, int, int], StaticConfig] = {}
    for u in DEGREE_MICROBATCH_SIZES:
        for t in DEGREE_TPS:
            if req.global_batch % u:
                continue
            parallel = replace(req.parallel, dp=None, tp=t, cp=enc.cp, microbatch_size=u)
            try:
                found = search_candidates(stats, cost, parallel)
            except ConfigError:
                continue
            for c in found:
                key = (c.dp, c.encoder.tp, c.microbatch_size)
                if c.memory_ok and key != current and key not in best:
                    best[key] = c
    ranked = sorted(best.values(), key=lambda c: c.sort_key())[:top]
    return [
        replace(setup, layout=c.to_layout(), config=c,
                source=f"Algorithm 2 at dp {c.dp}, tp {c.encoder.tp}, microbatch size {c.microbatch_size} (window)")
        for c in ranked
    ]  # fmt: skip


def degrees_replanner(
    split_replan: Replanner, req: ConfigRequest, cost: CostModel, judge: WindowJudge
) -> Replanner:
    """``ReplanSettings.degrees``: two finalists for the monitor (``DriftMonitor``, which takes the one with
    the lower window time plus its own re-plan cost): ``split_replan``'s pick (the best split at the run's
    degrees), and of ``degree_candidates`` on the window's samples the one ``judge`` puts fastest on the
    window's batches (``fastest``), from the start of its memory check that got there."""

    def replan(batches: list[Sequence[SampleWork]]) -> list[SystemSetup]:
        pick = split_replan(batches)
        items = [w.meta if w.meta is not None else w for b in batches for w in b]
        others = degree_candidates(pick, items, cost, req)
        if not others:
            return [pick]
        return [pick, judge.start(fastest(others, batches, judge, judge.bound), batches)]

    return replan


_JUDGE_MEMO_MAX = 4096


class WindowJudge:
    """The simulated mean iteration ms of a setup on a window as it would run there (``__call__``, a
    ``WindowTime``): after the simulated memory check's recomputation where a rank overflows
    (``choose.judged_ms``, the planner's judge) from the plan's own recomputation and from none
    (``memory_fit.from_peaks``, two of ``deploy``'s starts), the faster; ``inf`` where neither fits.
    Not as planned: a plan made for lighter data overflows a heavy window (3B, chartqa's plan on
    docvqa: 141 GB peak on a 48 GB GPU), and as planned, without the recomputation it needs, it beat
    the window's own plan, which has it (benchmarks/results/replan.md, "Finding A"). Memoised per
    (layout, options, the batches' identity; the batches are held so their ids stay theirs)."""

    def __init__(self, system: str, cost: CostModel, extra_options: dict | None = None):
        self.system, self.cost, self.extra = system, cost, dict(extra_options or {})
        self.cache: dict = {}
        self.held: list = []

    def _key(self, kind: str, setup: SystemSetup, batches: list[Sequence[SampleWork]]) -> tuple:
        options = {**setup.options, **self.extra}
        return kind, repr((setup.layout, sorted(options.items()))), tuple(id(b) for b in batches)

    def _memo(self, kind: str, setup: SystemSetup, batches: list[Sequence[SampleWork]]) -> float:
        key, options = self._key(kind, setup, batches), {**setup.options, **self.extra}
        if key not in self.cache:
            if len(self.cache) >= _JUDGE_MEMO_MAX:
                self.cache.clear()
                self.held.clear()
            self.held.append(list(batches))
            one = replace(setup, options=options)
            if kind == "judged":
                self.cache[key] = judged_ms(one, batches, self.cost, JUDGE_REPLICAS, self.system)[0]
            else:
                run = run_system(self.system, one.layout, batches, self.cost, options, trace_iterations=0)
                self.cache[key] = run.metrics.iteration_time_ms
                self.cache[("fits", *key[1:])] = run.metrics.fits_memory
        return self.cache[key]

    def _starts(self, setup: SystemSetup) -> list[SystemSetup]:
        return [s for s in (setup, from_peaks(setup)) if s is not None]

    def __call__(self, setup: SystemSetup, batches: list[Sequence[SampleWork]]) -> float:
        return min(self._memo("judged", s, batches) for s in self._starts(setup))

    def start(self, setup: SystemSetup, batches: list[Sequence[SampleWork]]) -> SystemSetup:
        """The start (``setup``, or it without recomputation) whose memory check is the faster."""
        return min(self._starts(setup), key=lambda s: self._memo("judged", s, batches))

    def planned(self, setup: SystemSetup, batches: list[Sequence[SampleWork]]) -> float:
        """The plan as planned (no memory check)."""
        return self._memo("planned", setup, batches)

    def planned_fits(self, setup: SystemSetup, batches: list[Sequence[SampleWork]]) -> bool | None:
        """Whether the plan as planned fits device memory on ``batches`` (``planned``'s run)."""
        self.planned(setup, batches)
        return self.cache[self._key("fits", setup, batches)]

    def bound(self, setup: SystemSetup, batches: list[Sequence[SampleWork]]) -> float:
        """A lower bound of ``__call__``: the plan as planned without recomputation (the check only
        adds recomputation); ``fastest``'s pruning."""
        return self.planned(from_peaks(setup) or setup, batches)


def window_time(system: str, cost: CostModel, extra_options: dict | None = None) -> WindowJudge:
    """The monitor's and the re-planner's judge of a setup on the window (``WindowJudge``)."""
    return WindowJudge(system, cost, extra_options)


def monitor_for(
    system: str,
    setup: SystemSetup,
    req: ConfigRequest,
    cost: CostModel,
    sampler,
    *,
    total_iterations: int,
    settings: ReplanSettings,
    extra_options: dict | None = None,
) -> DriftMonitor:
    """The monitor of ``system``'s run: the reference is the planner's draws (``planner_draws``)."""
    reference = [w for b in planner_draws(sampler, cost, req) for w in b]
    judge = window_time(system, cost, extra_options)
    return DriftMonitor(
        setup,
        reference,
        cost,
        replanner=window_replanner(system, req, cost, judge, degrees=settings.degrees),
        window_time=judge,
        total_iterations=total_iterations,
        settings=settings,
    )


def adaptive_deploy(
    system: str,
    monitor: DriftMonitor,
    batches: Sequence[Sequence[SampleWork]],
    cost: CostModel,
    extra_options: dict | None = None,
    *,
    memory_check: bool = True,
) -> AdaptiveRun:
    """Run the monitor over ``batches`` in order, then deploy and simulate each segment (without
    ``memory_check``: simulate each segment's plan as planned, no recomputation added)."""
    segments, start, current = [], 0, monitor.setup
    for i, batch in enumerate(batches):
        new = monitor.observe(i, batch)
        if new is not None:
            segments.append((current, start, i + 1))
            current, start = new, i + 1
    segments.append((current, start, len(batches)))
    deployed, runs = [], []
    for setup, lo, hi in segments:
        options = {**setup.options, **(extra_options or {})}
        if memory_check:
            got, run = deploy(system, setup, batches[lo:hi], cost, options)
        else:
            got, run = (
                setup,
                run_system(system, setup.layout, batches[lo:hi], cost, options, trace_iterations=0),
            )
        deployed.append(got)
        runs.append(run)
    first = runs[0]
    return AdaptiveRun(deployed, replace(first, metrics=join_metrics([r.metrics for r in runs])), monitor)


def _weighted(parts: list[SystemMetrics], key: str) -> float:
    weights = [len(m.iteration_time_ms_per_iter) for m in parts]
    return float(np.average([getattr(m, key) for m in parts], weights=weights))


def _elementwise_max(lists: list[list[float] | None]) -> list[float] | None:
    if any(x is None for x in lists):
        return None
    width = max(len(x) for x in lists)
    return [max(x[i] if i < len(x) else 0.0 for x in lists) for i in range(width)]


def join_metrics(parts: list[SystemMetrics]) -> SystemMetrics:
    """Consecutive segments' metrics as one run's: per-iteration times concatenated, means weighted by
    iterations, each pipeline rank's peak memory (and model state) the maximum over segments."""
    if len(parts) == 1:
        return parts[0]
    per_iter = [t for m in parts for t in m.iteration_time_ms_per_iter]
    states = _elementwise_max([m.model_state_bytes_per_rank for m in parts])
    peaks = _elementwise_max(
        [m.peak_memory_bytes_per_rank or m.peak_activation_bytes_per_rank for m in parts]
    )
    if states is not None and peaks is not None:  # activations such that activations + state = the peak
        peaks = [p - s for p, s in zip(peaks, states)]
    peaks = peaks or []
    held = None  # with messages in flight counted: activations + messages such that + state = the peak
    if all(m.peak_held_bytes_per_rank is not None for m in parts):
        held, peaks = peaks, _elementwise_max([m.peak_activation_bytes_per_rank for m in parts])
    return SystemMetrics(
        iteration_time_ms=float(np.mean(per_iter)),
        iteration_time_ms_per_iter=per_iter,
        bubble_ratio=_weighted(parts, "bubble_ratio"),
        encoder_fwd_std_ms=_weighted(parts, "encoder_fwd_std_ms"),
        llm_fwd_std_ms=_weighted(parts, "llm_fwd_std_ms"),
        peak_activation_bytes=max(peaks, default=0.0),
        peak_activation_bytes_per_rank=peaks,
        ideal_ms=_weighted(parts, "ideal_ms"),
        partition_ideal_ms=_weighted(parts, "partition_ideal_ms"),
        lower_bound_ms=_weighted(parts, "lower_bound_ms"),
        model_state_bytes_per_rank=states,
        device_memory_bytes=parts[0].device_memory_bytes,
        in_flight_message_bytes_per_rank=_elementwise_max(
            [m.in_flight_message_bytes_per_rank for m in parts]
        ),
        peak_held_bytes_per_rank=held,
    )
