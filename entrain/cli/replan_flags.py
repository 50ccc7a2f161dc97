"""``--replan`` and its settings, shared by ``simulate`` and ``train`` (docs/contract.md;
docs/design.md §4, Drift; the monitor and the decision: ``entrain.sim.drift``)."""

from __future__ import annotations

import argparse

from entrain.sim.drift import DEFAULT_THRESHOLD, DEFAULT_WINDOW, REPLAN_MODES, RESTART_MS

__all__ = ["add_replan_args"]


def add_replan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replan", choices=REPLAN_MODES, default="off",
                   help="'auto': watch each iteration's work against the profiled distribution and re-plan "
                        "Entrain's encoder/LLM split (Algorithms 1-2 on the recent window, checkpoint, continue "
                        "on the new layout) when the simulator predicts it saves more than --replan-threshold "
                        "of the remaining time net of the re-plan's cost; 'off' (default): one plan for the run")  # fmt: skip
    p.add_argument("--replan-window", type=int, default=DEFAULT_WINDOW,
                   help=f"iterations that must all drift before a re-plan is considered; the re-plan is made "
                        f"on them (default {DEFAULT_WINDOW})")  # fmt: skip
    p.add_argument("--replan-threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"predicted fraction of the remaining time a re-plan must save, net of its cost "
                        f"(default {DEFAULT_THRESHOLD})")  # fmt: skip
    p.add_argument("--replan-restart-s", type=float, default=RESTART_MS / 1000,
                   help=f"the re-plan's restart cost in seconds, besides writing and reading the checkpoint "
                        f"(default {RESTART_MS / 1000:g})")  # fmt: skip
    p.add_argument("--replan-degrees", action="store_true",
                   help="with --replan auto: a re-plan may also change DP, TP and the microbatch size (the global "
                        "batch and the GPU count kept): Algorithm 2's best configuration at each other degree is a "
                        "candidate beside the best split at the run's degrees, the lower window time x iterations "
                        "left + switch cost taken; train restarts the group on the new degrees from the "
                        "checkpoint (resharded)")  # fmt: skip
