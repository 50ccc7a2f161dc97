"""The systems Entrain compares (CONTRACT.md): the only list of them. Each ``SystemSpec`` names the
system's batcher (one global batch -> per-replica microbatches), its schedule generator (assignments
-> Plan), the kind of layout it runs on, how its configuration is chosen, and which of Entrain's own
extensions (beyond the paper) it accepts. The CLI's choices, the simulator, the runtime and the bench
all read ``SYSTEMS``; ``plan_system`` turns global batches into a system's Plan for both executors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from entrain.core.assignment.hierarchical import assign_entrain
from entrain.core.assignment.types import IterationAssignment
from entrain.core.batching.dip import assign_dip
from entrain.core.batching.disttrain import assign_disttrain
from entrain.core.batching.onef1b import assign_1f1b
from entrain.core.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.plan import ActionKind, Layout, Plan
from entrain.core.schedules import (
    dip,
    dip_greedy,
    disttrain,
    disttrain_paper,
    entrain,
    entrain_1f1b,
    one_f_one_b,
)
from entrain.core.schedules.common import ScheduleOptions
from entrain.core.schedules.costs import PlanCosts
from entrain.core.work import SampleWork

__all__ = [
    "SystemSpec",
    "SYSTEMS",
    "EXTENSIONS",
    "get_system",
    "parse_systems",
    "generate_plan",
    "plan_system",
    "stage_times_fn",
]

Batcher = Callable[..., IterationAssignment]
Generator = Callable[..., Plan]

EXTENSIONS = ("layout", "ramp", "split")
"""Entrain's switchable extensions (ours, not the paper's): boundary-sharing layout, fill/drain ramp,
split weight gradients."""


@dataclass(frozen=True)
class SystemSpec:
    name: str
    batcher: Batcher
    """``batcher(batch, dp, num_microbatches, *, stage_times=None) -> IterationAssignment``."""
    generator: Generator
    """``generate(layout, assignments, samples, cost, options, system=...) -> Plan``."""
    layout: str
    """``"disjoint"``: encoder stages then LLM stages on their own ranks; ``"colocated"``: rank r holds
    encoder chunk r and LLM chunk r (equal stage counts)."""
    config: str
    """How its configuration is chosen (``entrain.core.setups``): ``"entrain"`` (Algorithm 1 + 2),
    ``"disttrain"`` (Algorithm 2 on one sample), ``"disttrain-paper"`` (paper Table 1), ``"dip"``."""
    extensions: tuple[str, ...] = ()
    """Which of ``EXTENSIONS`` it accepts."""

    @property
    def colocated(self) -> bool:
        return self.layout == "colocated"

    def ranks_per_replica(self, encoder_stages: int, llm_stages: int) -> int:
        return encoder_stages if self.colocated else encoder_stages + llm_stages


SYSTEMS: dict[str, SystemSpec] = {
    s.name: s
    for s in (
        SystemSpec("entrain", assign_entrain, entrain.generate, "disjoint", "entrain", EXTENSIONS),
        SystemSpec("entrain-1f1b", assign_entrain, entrain_1f1b.generate, "disjoint", "entrain", EXTENSIONS),
        SystemSpec("1f1b", assign_1f1b, one_f_one_b.generate, "disjoint", "entrain"),
        SystemSpec("disttrain", assign_disttrain, disttrain.generate, "disjoint", "disttrain"),
        SystemSpec(
            "disttrain-paper", assign_disttrain, disttrain_paper.generate, "disjoint", "disttrain-paper"
        ),
        SystemSpec("dip", assign_dip, dip.generate, "colocated", "dip"),
        SystemSpec("dip-greedy", assign_dip, dip_greedy.generate, "colocated", "dip"),
    )
}


def get_system(name: str) -> SystemSpec:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ConfigError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}") from None


def parse_systems(text: str) -> list[str]:
    """A comma list of system names (at least one), each known."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise ConfigError(f"expected at least one system of {', '.join(SYSTEMS)}, got {text!r}")
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown:
        raise ConfigError(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    return names


def generate_plan(
    system: str,
    layout: Layout,
    assignments: Sequence[IterationAssignment],
    samples: dict[str, SampleWork],
    cost: CostModel | None = None,
    options: ScheduleOptions | dict | None = None,
) -> Plan:
    """The Plan of ``system`` for these per-iteration assignments (lowered, ready to execute)."""
    gen = get_system(system).generator
    return gen(layout, list(assignments), samples, cost, ScheduleOptions.from_any(options), system=system)


def stage_times_fn(costs: PlanCosts):
    """For the DistTrain batcher: a microbatch's samples -> ``(2, S)`` forward/backward ms per
    stage of ``costs.layout`` (one call each, per-call constants included)."""

    def times(samples: Sequence[SampleWork]) -> np.ndarray:
        ids = [s.id for s in samples]
        n = len(costs.layout.stages)
        fwd = [costs.compute_ms(s, ActionKind.F, ids) for s in range(n)]
        bwd = [costs.compute_ms(s, ActionKind.B, ids) for s in range(n)]
        return np.array([fwd, bwd])

    return times


def plan_system(
    system: str,
    layout: Layout,
    batches: Sequence[Sequence[SampleWork]],
    cost: CostModel,
    options: ScheduleOptions | dict | None = None,
) -> Plan:
    """One iteration per global batch: ``system``'s assignment, then its generator's Plan. Both
    executors (``entrain.sim`` and ``entrain.runtime``) get their Plans from here."""
    spec = get_system(system)
    samples = {s.id: s for batch in batches for s in batch}
    costs = PlanCosts(layout, cost, samples)
    times = stage_times_fn(costs)
    assignments = [
        spec.batcher(list(b), layout.dp, layout.num_microbatches, stage_times=times) for b in batches
    ]
    return generate_plan(system, layout, assignments, samples, cost, options)
