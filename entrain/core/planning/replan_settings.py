"""``--replan``'s settings and defaults (the drift monitor itself: ``entrain.sim.drift``); in core so
the run configuration (``entrain.config``) can hold them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from entrain.core.errors import ConfigError

__all__ = [
    "REPLAN_MODES",
    "DRIFT_TRIGGER",
    "DEFAULT_WINDOW",
    "DEFAULT_THRESHOLD",
    "RESTART_MS",
    "ReplanSettings",
]

REPLAN_MODES = ("off", "auto")
DRIFT_TRIGGER = math.log(1.5)
"""The window drifted when its pooled mean encoder or LLM work per sample is 1.5x (or 1/1.5) the
reference's (the window the current split was last judged on by the simulator; at first the planner's
draws). Measured at the paper's global batch (512, 8 iterations, seeds 0 and 1, 1B): the largest
single-batch drift of the paper's datasets and the zoo is SynthChartNet's 0.41 (its regime runs; a
window of 2 pools it below 0.35), every other one at most 0.17; ``curriculum``'s phase changes are
2.5 (chartqa -> docvqa) and 0.53 (docvqa -> video). The trigger only saves the simulator's time: the
predicted gain in time decides a re-plan (``entrain.sim.drift``)."""
DEFAULT_WINDOW = 2
"""Iterations that must all drift before a re-plan is considered (and that it is planned on)."""
DEFAULT_THRESHOLD = 0.05
"""A re-plan fires when it is predicted to save more than 5 % of the remaining run's time, net of its
own cost."""
RESTART_MS = 60_000.0
"""Stopping and restarting the worker group on the new layout: process-group rendezvous, model
construction and the data pipeline's warm-up [assumed: one minute at the paper's scale]."""


@dataclass(frozen=True)
class ReplanSettings:
    window: int = DEFAULT_WINDOW
    threshold: float = DEFAULT_THRESHOLD
    restart_ms: float = RESTART_MS
    trigger: float = DRIFT_TRIGGER
    degrees: bool = False
    """What a re-plan may change. False: the encoder/LLM split at the run's TP and microbatch size (and
    DP where the run left it open). True: also DP, TP and the microbatch size (the global batch kept):
    the best split at the run's degrees and the best at any other (``entrain.sim.adaptive.
    degrees_replanner``), the one whose window time plus its own switch cost over the iterations left is
    lower (``entrain.sim.drift.ReplanChoice``). The switch costs what any re-plan costs: the runtime
    restarts the worker group from a checkpoint for every re-plan and reshards the checkpoint by name
    onto the new layout (``entrain.sim.drift.replan_cost_ms``). ``--replan-degrees`` sets it for
    ``simulate`` and ``train``; ``train``'s restart runs the new plan's DP, TP and microbatch size
    (``entrain.cli.train_args.relaunch_args``), and the resume fingerprint accepts the microbatch size the
    re-plan set on the checkpoint it took (``entrain.runtime.replan.replanned_values``)."""

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ConfigError(f"--replan-window must be >= 1, got {self.window}")
        if self.restart_ms < 0:
            raise ConfigError(f"--replan-restart-s must be >= 0, got {self.restart_ms / 1000:g}")
