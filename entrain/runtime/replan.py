"""``train --replan auto``: the drift monitor between steps and the hand-over of a re-plan (no torch).

Every rank runs the same monitor (``entrain.sim.drift.DriftMonitor``, built by the CLI's
``MonitorFactory``: the runtime does not import the simulator) on the same batches, so every rank
reaches the same decision without communicating. When a re-plan fires after step ``s``:

1. the step's ``metrics.jsonl`` row gets ``{"replan": {...}}``;
2. the run checkpoints at step ``s + 1`` (as ``--checkpoint-every`` would);
3. rank 0 writes the new layout as a plan file ``OUT/replan/plan-<s+1>.json`` (the format of
   ``entrain plan --out``) and ``OUT/replan/state.json`` (the monitor's reference and the re-plans so
   far, the plan file's path);
4. every rank leaves with ``REPLAN_EXIT``; the launcher (``entrain.cli.launch``) restarts the worker
   group with ``--plan OUT/replan/plan-<s+1>.json --resume``: the checkpoint is resharded onto the new
   layout (``entrain.runtime.checkpoint``) and the run continues from step ``s + 1`` exactly as a run
   started on that layout from that checkpoint, watched by a monitor restored from ``state.json``.

A later ``--resume`` with the run's original flags continues on the layout the run was last on
(``last_plan``: the newest re-plan at or before its newest checkpoint), as the launcher's restart does.

With ``--replan-degrees`` the new plan may have another DP, TP and microbatch size (the process count
kept: ``StepMonitor.observe`` refuses a layout on another). The restart runs the plan's degrees
(``relaunch_args``), the checkpoint is resharded to them, and the resume fingerprint accepts on the
re-plan's own checkpoint the microbatch size its plan file set (``replanned_values``), no other.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from entrain.config import RunConfig
from entrain.core.costs.costmodel import CostModel
from entrain.core.errors import EntrainError
from entrain.core.ir.plan import Layout
from entrain.core.planning.plan_file import load_plan_dict
from entrain.core.planning.setups import SystemSetup, setup_to_json
from entrain.core.workload.work import SampleWork

__all__ = [
    "REPLAN_EXIT",
    "REPLAN_DIR",
    "ReplanRequested",
    "MonitorFactory",
    "StepMonitor",
    "step_monitor",
    "read_state",
    "last_plan",
    "replanned_values",
    "processes",
]

REPLAN_EXIT = 75
"""A worker's exit status after a re-plan's checkpoint: the launcher restarts the group on the new plan."""
REPLAN_DIR = "replan"
STATE_FILE = "state.json"


class ReplanRequested(Exception):  # noqa: N818 - a signal, not an error
    """Raised by a rank after the re-plan's checkpoint; ``plan_path`` holds the new layout."""

    def __init__(self, step: int, plan_path: str):
        super().__init__(f"re-plan after step {step}: continue on {plan_path}")
        self.step, self.plan_path = step, plan_path


MonitorFactory = Callable[[RunConfig, str, SystemSetup, CostModel, Sequence[Sequence[SampleWork]]], object]
"""``(spec, system, setup, cost, train batches) -> DriftMonitor`` (``entrain.sim.drift``) or None where
``system`` is not re-planned."""


def read_state(out: str) -> dict | None:
    path = os.path.join(out, REPLAN_DIR, STATE_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def last_plan(out: str, checkpoint_step: int) -> str | None:
    """The plan file of the layout a run in ``out`` was last on at ``checkpoint_step`` (its newest
    complete checkpoint): the newest ``replan/plan-<s>.json`` with ``s <= checkpoint_step``; None
    when it had not re-planned by then (it ran on the layout its flags give)."""
    folder = os.path.join(out, REPLAN_DIR)
    steps = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        match = re.fullmatch(r"plan-(\d+)\.json", name)
        if match and int(match.group(1)) <= checkpoint_step:
            steps.append(int(match.group(1)))
    return os.path.join(folder, f"plan-{max(steps)}.json") if steps else None


def replanned_values(out: str, step: int) -> dict:
    """The resume fingerprint's values a re-plan set that the checkpoint at ``step`` does not hold:
    a re-plan's own checkpoint (``replan/plan-<step>.json`` exists: taken on the old layout) resumes on
    its plan file, whose microbatch size (``{"microbatch_size": ...}``) may differ from the one the
    checkpoint was written with; ``{}`` for every other checkpoint. DP and TP need none: a checkpoint is
    resharded onto any (``entrain.runtime.checkpoint.RESHARDABLE``)."""
    path = os.path.join(out, REPLAN_DIR, f"plan-{step}.json")
    if not os.path.exists(path):
        return {}
    return {"microbatch_size": load_plan_dict(path)["microbatch_size"]}


def processes(layout: Layout) -> int:
    """The processes ``layout`` runs on: DP x pipeline ranks x TP (one ``--tp`` for every component; the
    LLM's, which every layout has)."""
    return layout.world_size * layout.components["llm"].tp


@dataclass
class StepMonitor:
    """One system's monitor in a training run."""

    spec: RunConfig
    system: str
    out: str
    monitor: object
    pending: SystemSetup | None = None

    def observe(self, step: int, batch: Sequence[SampleWork]) -> dict | None:
        """The re-plan record (``Replan.to_json``) when one fires after ``step``."""
        before = self.monitor.setup.layout
        self.pending = self.monitor.observe(step, batch)
        if self.pending is None:
            return None
        if processes(self.pending.layout) != processes(before):  # the group restarts on the same processes
            after = self.pending.layout
            raise EntrainError(
                f"the re-plan after step {step} chose dp {after.dp} x {after.ranks_per_replica} pipeline ranks "
                f"x tp {after.components['llm'].tp} = {processes(after)} processes, but the run has "
                f"{processes(before)}"
            )
        return self.monitor.replans[-1].to_json()

    def hand_over(self, step: int, owner: bool) -> ReplanRequested:
        """Write the new plan file and the monitor's state (``owner``: rank 0); the signal to raise."""
        folder = os.path.join(self.out, REPLAN_DIR)
        path = os.path.join(folder, f"plan-{step + 1}.json")
        if owner:
            os.makedirs(folder, exist_ok=True)
            vision = self.spec.data.vision()
            plan = {
                **setup_to_json(self.system, self.pending),
                "model": self.spec.model.label(),
                "dataset": self.spec.data.dataset,
                "min_pixels": vision.min_pixels,
                "max_pixels": vision.max_pixels,
            }
            _write(path, plan)
            _write(
                os.path.join(folder, STATE_FILE),
                {"step": step + 1, "plan": path, **self.monitor.state_json()},
            )
        return ReplanRequested(step, path)

    def replans(self) -> list[dict]:
        return [r.to_json() for r in self.monitor.replans]


def _write(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def step_monitor(
    factory: MonitorFactory | None,
    spec: RunConfig,
    system: str,
    setup: SystemSetup,
    cost: CostModel,
    batches: Sequence[Sequence[SampleWork]],
    out: str,
    start: int,
) -> StepMonitor | None:
    """The system's monitor (None with ``--replan off``); a resumed run continues from ``state.json``
    where it was written for a step at or before ``start``."""
    if factory is None or getattr(spec.schedule, "replan", "off") != "auto":
        return None
    monitor = factory(spec, system, setup, cost, batches)
    if monitor is None:
        return None
    state = read_state(out)
    if state is not None and 0 < state["step"] <= start:
        monitor.restore(state)
    return StepMonitor(spec, system, out, monitor)
