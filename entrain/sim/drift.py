"""The drift monitor and the re-plan decision (``--replan auto``; torch-free: ``simulate`` and ``train``
both run it).

Per iteration the monitor compares the assigned global batch's work with the profiled distribution
(the planner's draws, or the window a re-plan was made on): the batch's mean per-sample encoder and
LLM work (``SampleWork``, forward + backward ms) over the reference's, ``encoder_work_ratio`` and
``llm_work_ratio``; ``drift`` = the larger ``|ln ratio|``.

The decision is the predicted gain in time, every ``window`` iterations: Algorithms 1-2 re-run on
the window's samples (the caller's ``Replanner``: the best split for the window; with
``ReplanSettings.degrees`` also the best at other DP / TP / microbatch size, the finalist with the lower
window time plus its own re-plan cost taken, ``ReplanChoice``), and the simulator's
time of the current split and of the new one on the window's batches as each would run there (the
caller's ``WindowTime``: ``entrain.sim.adaptive.window_time``, after the memory check's
recomputation; a split that fits the window in no way is ``inf``)::

    predicted_gain = ((t_current - t_new) * H - replan_cost_ms) / (t_current * H)

with ``H`` the iterations left after this one (the window's workload is assumed to last) and
``replan_cost_ms`` = ``replan_cost_ms()``: writing the checkpoint on the old layout, restarting the
worker group and reading (resharding) it on the new one. A re-plan fires when ``predicted_gain`` >
``threshold``; the new layout runs from the next iteration. A gain at or below the threshold is
evaluated again only after another ``window`` iterations.

Each evaluation simulates the window on every candidate split (tens of seconds at the paper's scale,
on every rank of a training run), so a cheap trigger decides whether the window is worth it: its
pooled work moved by more than ``trigger`` (``|ln ratio|``) from the reference, the window the
current split was last judged on (by a re-plan or an evaluation that kept it; at the start, the
planner's draws). The reference moves only when the simulator has judged the split on the new
workload, so a drift that arrives in steps (``curriculum``'s docvqa -> video) is evaluated at each
step. ``trigger=0`` evaluates every window (the benchmark's setting, ``benchmarks/replan.py``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from entrain.core.costs.costmodel import CostModel
from entrain.core.ir.plan import Layout
from entrain.core.planning.replan_settings import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW,
    DRIFT_TRIGGER,
    REPLAN_MODES,
    RESTART_MS,
    ReplanSettings,
)
from entrain.core.planning.setups import SystemSetup
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.workload.work import SampleWork

__all__ = [
    "DRIFT_TRIGGER",
    "DEFAULT_WINDOW",
    "DEFAULT_THRESHOLD",
    "RESTART_MS",
    "STORAGE_BYTES_PER_MS",
    "REPLAN_MODES",
    "ReplanSettings",
    "WorkProfile",
    "IterationDrift",
    "Replan",
    "ReplanChoice",
    "DriftMonitor",
    "allocation",
    "what_changed",
    "replan_cost_ms",
]

STORAGE_BYTES_PER_MS = 1e6
"""Checkpoint write and read bandwidth per GPU (1 GB/s, a parallel file system's share per GPU)
[assumed]; every GPU of one replica writes its own shard (DCP), every GPU of the new layout reads its
own (resharding)."""


@dataclass(frozen=True)
class WorkProfile:
    """Mean per-sample encoder and LLM work (ms) of a set of samples."""

    encoder_ms: float
    llm_ms: float

    @classmethod
    def of(cls, samples: Sequence[SampleWork]) -> WorkProfile:
        n = max(1, len(samples))
        return cls(sum(w.encoder for w in samples) / n, sum(w.llm for w in samples) / n)

    def ratios(self, batch: Sequence[SampleWork]) -> tuple[float, float]:
        """``batch``'s mean encoder and LLM work over this profile's."""
        got = WorkProfile.of(batch)
        return _ratio(got.encoder_ms, self.encoder_ms), _ratio(got.llm_ms, self.llm_ms)


def _drift(encoder_ratio: float, llm_ratio: float) -> float:
    return max(abs(math.log(encoder_ratio)), abs(math.log(llm_ratio)))


def _ratio(value: float, reference: float) -> float:
    if reference <= 0:
        return 1.0 if value <= 0 else math.inf
    return max(value, 1e-300) / reference


@dataclass(frozen=True)
class IterationDrift:
    iteration: int
    encoder_work_ratio: float
    llm_work_ratio: float
    drift: float
    predicted_gain: float | None = None
    """None where the gate was closed (no evaluation this iteration)."""

    def to_json(self) -> dict:
        return {
            "iteration": self.iteration,
            "encoder_work_ratio": self.encoder_work_ratio,
            "llm_work_ratio": self.llm_work_ratio,
            "drift": self.drift,
            "predicted_gain": self.predicted_gain,
        }


@dataclass(frozen=True)
class Replan:
    iteration: int
    """The last iteration on the old layout (the checkpoint is taken after it)."""
    old_allocation: dict
    new_allocation: dict
    predicted_gain: float
    old_microbatch_size: int | None = None
    new_microbatch_size: int | None = None
    """None in a re-plan recorded before these fields (a restored ``state.json``)."""
    changed: tuple[str, ...] = ()
    """What the re-plan changed (``what_changed``): of ``dp``, ``tp``, ``cp``, ``microbatch_size`` and
    ``split`` (the stages: their components, layer ranges and pipeline ranks)."""

    def to_json(self) -> dict:
        return {
            "iteration": self.iteration,
            "old_allocation": self.old_allocation,
            "new_allocation": self.new_allocation,
            "predicted_gain": self.predicted_gain,
            "old_microbatch_size": self.old_microbatch_size,
            "new_microbatch_size": self.new_microbatch_size,
            "changed": list(self.changed),
        }

    @classmethod
    def from_json(cls, d: dict) -> Replan:
        return cls(**{**d, "changed": tuple(d.get("changed", ()))})


@dataclass(frozen=True)
class ReplanChoice:
    """One evaluation's choice among the re-planner's finalists (several where ``ReplanSettings.degrees``:
    the best split at the run's degrees, the best at other DP / TP / microbatch size): each finalist's
    window time and switch cost (``replan_cost_ms`` from the split in use), and the one taken, the lowest
    ``window_ms * left + switch_ms`` (None: none fits the window). Whether it fires is the gain's
    (``Replan``)."""

    iteration: int
    current_ms: float
    left: int
    finalists: tuple[dict, ...]
    """Each: ``allocation``, ``microbatch_size``, ``window_ms``, ``switch_ms``, ``source``."""
    chosen: int | None

    def to_json(self) -> dict:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        finalists = [{**f, "window_ms": num(f["window_ms"])} for f in self.finalists]
        return {"iteration": self.iteration, "current_ms": num(self.current_ms), "left": self.left,
                "finalists": finalists, "chosen": self.chosen}  # fmt: skip


def allocation(layout: Layout) -> dict:
    """The GPU split of a layout: DP and each component's TP / CP / pipeline stages."""
    return {
        "dp": layout.dp,
        "ranks_per_replica": layout.ranks_per_replica,
        **{name: comp.to_json() for name, comp in layout.components.items()},
    }


def what_changed(old: Layout, new: Layout) -> tuple[str, ...]:
    """What moving from ``old`` to ``new`` changes, in this order: ``dp``, ``tp``, ``cp`` (any
    component's), ``microbatch_size``, ``split`` (the stages' components, layer ranges or pipeline
    ranks)."""

    def degree(layout: Layout, name: str) -> dict:
        return {c: getattr(comp, name) for c, comp in layout.components.items()}

    def stages(layout: Layout) -> list:
        return [(s.component, s.first_layer, s.end_layer, s.pp_rank) for s in layout.stages]

    checks = (
        ("dp", old.dp != new.dp),
        ("tp", degree(old, "tp") != degree(new, "tp")),
        ("cp", degree(old, "cp") != degree(new, "cp")),
        ("microbatch_size", old.microbatch_size != new.microbatch_size),
        ("split", stages(old) != stages(new)),
    )
    return tuple(name for name, moved in checks if moved)


def _shard_ms(layout: Layout, cost: CostModel) -> float:
    """The slowest GPU's checkpoint shard transfer on ``layout`` (its model state / storage bandwidth)."""
    costs = PlanCosts(layout, cost, {})
    return max(costs.model_state_bytes(r) for r in range(layout.ranks_per_replica)) / STORAGE_BYTES_PER_MS


def replan_cost_ms(old: Layout, new: Layout, cost: CostModel, restart_ms: float = RESTART_MS) -> float:
    """Checkpoint on ``old`` + restart + reshard onto ``new`` (module docstring)."""
    return _shard_ms(old, cost) + restart_ms + _shard_ms(new, cost)


Replanner = Callable[[list[Sequence[SampleWork]]], "SystemSetup | Sequence[SystemSetup]"]
"""Algorithms 1-2 (and Entrain's extensions) on the window's batches -> the new setup, or several
finalists (``ReplanSettings.degrees``), of which the monitor takes the one with the lowest window time
plus switch cost over the iterations left (``ReplanChoice``)."""
WindowTime = Callable[[SystemSetup, list[Sequence[SampleWork]]], float]
"""The simulator's mean iteration ms of a setup on the window's batches (``inf``: it does not fit)."""


class DriftMonitor:
    """Watches one system's iterations (``observe``) and decides its re-plans (module docstring)."""

    def __init__(
        self,
        setup: SystemSetup,
        reference: Sequence[SampleWork],
        cost: CostModel,
        *,
        replanner: Replanner,
        window_time: WindowTime,
        total_iterations: int,
        settings: ReplanSettings | None = None,
    ):
        self.setup, self.cost = setup, cost
        self.settings = settings = settings or ReplanSettings()
        self.replanner, self.window_time = replanner, window_time
        self.total_iterations = total_iterations
        self.profile = WorkProfile.of(reference)
        self.window: deque[Sequence[SampleWork]] = deque(maxlen=settings.window)
        self.next_evaluation = 0
        self.history: list[IterationDrift] = []
        self.replans: list[Replan] = []
        self.choices: list[ReplanChoice] = []
        """Every evaluation's choice among the re-planner's finalists (a fired re-plan or not)."""

    def observe(self, iteration: int, batch: Sequence[SampleWork]) -> SystemSetup | None:
        """Record iteration ``iteration``'s batch; the new setup when a re-plan fires after it."""
        enc, llm = self.profile.ratios(batch)
        self.window.append(batch)
        gain, new = self._evaluate(iteration) if self._gate_open(iteration) else (None, None)
        self.history.append(IterationDrift(iteration, enc, llm, _drift(enc, llm), gain))
        if gain is None or new is None or gain <= self.settings.threshold:
            return None
        before, after = self.setup.layout, new.layout
        self.replans.append(
            Replan(iteration, allocation(before), allocation(after), gain, before.microbatch_size,
                   after.microbatch_size, what_changed(before, after))
        )  # fmt: skip
        self.setup = new
        self.window.clear()
        return new

    def state_json(self) -> dict:
        """What a restarted run needs to continue watching (``restore``): the reference and the re-plans."""
        return {
            "profile": {"encoder_ms": self.profile.encoder_ms, "llm_ms": self.profile.llm_ms},
            "replans": [r.to_json() for r in self.replans],
        }

    def restore(self, state: dict) -> None:
        self.profile = WorkProfile(**state["profile"])
        self.replans = [Replan.from_json(r) for r in state["replans"]]

    def _gate_open(self, iteration: int) -> bool:
        if len(self.window) < self.settings.window or iteration < self.next_evaluation:
            return False
        if self.settings.trigger <= 0:
            return True
        pooled = self.profile.ratios([w for b in self.window for w in b])
        return _drift(*pooled) > self.settings.trigger

    def _evaluate(self, iteration: int) -> tuple[float, SystemSetup | None]:
        self.next_evaluation = iteration + self.settings.window
        self.profile = WorkProfile.of([w for b in self.window for w in b])  # the split is judged on it
        left = self.total_iterations - iteration - 1
        if left <= 0:
            return -1.0, None
        batches = list(self.window)
        got = self.replanner(batches)
        finalists = [got] if isinstance(got, SystemSetup) else list(got)
        current_ms = self.window_time(self.setup, batches)
        new, new_ms, cost_ms = self._choose(iteration, left, current_ms, finalists, batches)
        if new is None:  # nothing the re-planner found fits the window
            return -1.0, None
        if not math.isfinite(current_ms):  # the split in use does not fit it even recomputing
            return 1.0, new
        if current_ms <= 0:
            return -1.0, None
        return ((current_ms - new_ms) * left - cost_ms) / (current_ms * left), new

    def _choose(
        self,
        iteration: int,
        left: int,
        current_ms: float,
        finalists: list[SystemSetup],
        batches: list[Sequence[SampleWork]],
    ) -> tuple[SystemSetup | None, float, float]:
        """The finalist with the lowest window time x ``left`` + its own switch cost (ties: the earlier;
        none where no finalist fits the window), its window time and switch cost; recorded
        (``choices``)."""
        scored = []
        for new in finalists:
            ms = self.window_time(new, batches)
            switch = replan_cost_ms(self.setup.layout, new.layout, self.cost, self.settings.restart_ms)
            scored.append((ms, switch))
        fits = [i for i, (ms, _) in enumerate(scored) if math.isfinite(ms)]
        best = min(fits, key=lambda i: scored[i][0] * left + scored[i][1], default=None)
        records = tuple(
            {"allocation": allocation(n.layout), "microbatch_size": n.layout.microbatch_size, "window_ms": ms,
             "switch_ms": switch, "source": n.source}
            for n, (ms, switch) in zip(finalists, scored)
        )  # fmt: skip
        self.choices.append(ReplanChoice(iteration, current_ms, left, records, best))
        if best is None:
            return None, math.inf, math.inf
        return finalists[best], *scored[best]
