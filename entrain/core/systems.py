"""The systems Entrain compares (docs/contract.md, "Names"): the only list of them. Each ``SystemSpec``
names the system's batcher (one global batch -> per-replica microbatches), its schedule generator
(assignments -> Plan), the kind of layout it runs on, how its configuration is chosen, and which of
Entrain's own extensions (beyond the paper) it accepts. The CLI's choices, the simulator, the runtime and
the bench all read ``SYSTEMS``; ``plan_system`` turns global batches into a system's Plan for both
executors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from entrain.core.assignment.batchers.common import Batcher
from entrain.core.assignment.batchers.dflop import assign_dflop
from entrain.core.assignment.batchers.dip import assign_dip
from entrain.core.assignment.batchers.disttrain import assign_disttrain
from entrain.core.assignment.batchers.onef1b import assign_1f1b
from entrain.core.assignment.batchers.rebalance import assign_encoder_rebalance
from entrain.core.assignment.hierarchical import assign_entrain
from entrain.core.costs.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.ir.microbatches import IterationAssignment
from entrain.core.ir.plan import ActionKind, Layout, Plan
from entrain.core.schedules import dip, dip_greedy, entrain, one_f_one_b
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.schedules.common import PlanGenerator, ScheduleOptions
from entrain.core.schedules.rebalance import rebalance_plan
from entrain.core.workload.work import SampleWork

__all__ = [
    "ENTRAIN",
    "ENTRAIN_1F1B",
    "ONE_F_ONE_B",
    "DISTTRAIN",
    "DISTTRAIN_PAPER",
    "DIP",
    "DIP_GREEDY",
    "DIP_GREEDY_MEM",
    "ENCODER_REBALANCE",
    "DFLOP",
    "CONFIG_ENTRAIN",
    "CONFIG_DISTTRAIN",
    "CONFIG_DISTTRAIN_PAPER",
    "CONFIG_DIP",
    "CONFIG_DFLOP",
    "SystemSpec",
    "SYSTEMS",
    "EXTENSIONS",
    "get_system",
    "refuse_several_encoders",
    "systems_where",
    "moves_across_replicas",
    "default_systems",
    "parse_systems",
    "generate_plan",
    "plan_system",
    "stage_times_fn",
]

ENTRAIN = entrain.NAME
"""The reference system: the one the others are compared to (speedups, ``vs_entrain``)."""
ENTRAIN_1F1B = "entrain-1f1b"
"""Entrain's assignment, sub-microbatches and split backward with the plain 1F1B warm-up
(``p - s - 1`` forwards): the eager-forward ablation (``entrain.generate`` with ``eager=False``)."""
ONE_F_ONE_B = one_f_one_b.NAME
DISTTRAIN = "disttrain"
"""DistTrain-like: plain 1F1B (``one_f_one_b.generate``) on disjoint encoder and LLM ranks; what
differs from ``1f1b`` is upstream (docs/design.md §2): the configuration comes from Algorithm 2 on one
profiled sample (``planning.baselines.disttrain_profile_sample``), and the ``disttrain`` batcher
gives each replica exactly U samples of every global microbatch by LPT on encoder cost, then
reorders whole microbatches by greedy insertion minimising the analytic 1F1B makespan (the
assignment's ``execution_order``, which the 1F1B generator follows)."""
DISTTRAIN_PAPER = "disttrain-paper"
"""DistTrain's schedule and batching under the paper's own Table 1 DistTrain configuration
(``planning.baselines.paper_table1_config``) instead of our one-sample Algorithm 2 pick."""
DIP = dip.NAME
DIP_GREEDY = dip_greedy.NAME
DIP_GREEDY_MEM = dip_greedy.MEMORY_BOUNDED
ENCODER_REBALANCE = "encoder-rebalance"
"""DistTrain's configuration and 1F1B on disjoint encoder and LLM ranks, with the encoder inputs
rebalanced across the DP replicas each iteration by all-to-all and the features returned to their
owners before the LLM (``assignment.batchers.rebalance``: VeOmni, MegaScale-Omni, LoongForge, OrchMLLM)."""
DFLOP = "dflop"
"""DFLOP (SIGMOD'26, arXiv 2603.25120): each module's layout from a profile of the input
distribution, the global batch split into ``dp * K`` variable-size microbatches by its min-max ILP
over both modules' predicted times (``assignment.batchers.dflop``: what we follow and every difference), 1F1B."""

CONFIG_ENTRAIN = ENTRAIN
"""``SystemSpec.config`` kinds (``entrain.core.planning.setups``), each named after the system that introduced
it: Algorithms 1 + 2; Algorithm 2 on one sample; paper Table 1; DIP's fixed DP/TP/PP."""
CONFIG_DISTTRAIN = DISTTRAIN
CONFIG_DISTTRAIN_PAPER = DISTTRAIN_PAPER
CONFIG_DIP = DIP
CONFIG_DFLOP = DFLOP

EXTENSIONS = ("layout", "ramp", "split", "assignment")
"""Entrain's switchable extensions (ours, not the paper's): boundary-sharing layout, fill/drain ramp,
split weight gradients, the two-resource assignment (``ScheduleOptions.assignment``)."""


@dataclass(frozen=True)
class SystemSpec:
    name: str
    batcher: Batcher
    """``batcher(batch, dp, num_microbatches, *, stage_times=None) -> IterationAssignment``."""
    generator: PlanGenerator
    """``generate(layout, assignments, samples, cost, options, system=...) -> Plan``; several systems
    may share one (a system that differs only upstream: batcher, configuration)."""
    layout: str
    """``"disjoint"``: encoder stages then LLM stages on their own ranks; ``"colocated"``: rank r holds
    encoder chunk r and LLM chunk r (equal stage counts)."""
    config: str
    """How its configuration is chosen (``entrain.core.planning.setups``): ``"entrain"`` (Algorithm 1 + 2),
    ``"disttrain"`` (Algorithm 2 on one sample), ``"disttrain-paper"`` (paper Table 1), ``"dip"``,
    ``"dflop"`` (Algorithm 2 on a draw of a global batch: DFLOP's optimizer on its input distribution)."""
    extensions: tuple[str, ...] = ()
    """Which of ``EXTENSIONS`` it accepts."""
    stage_chains: bool = False
    """Its generator runs several consecutive stages on one rank (a stage chain), so the memory check
    can recompute part of a rank's layers (``entrain.sim.memory_fit.escalate``)."""
    replannable: bool = False
    """``--replan auto`` re-plans it (its configuration is Algorithms 1-2 + extensions)."""
    default_in: tuple[str, ...] = ()
    """The commands (``simulate``, ``assign``) whose default ``--systems`` list includes it."""
    cross_replica_moves: bool = False
    """Its plans move encoder work across data-parallel replicas (a sample encoded off the replica that
    owns it): the runtime builds channels between replicas for them (``moves_across_replicas``)."""

    @property
    def colocated(self) -> bool:
        return self.layout == "colocated"

    @property
    def memory_fitted(self) -> bool:
        """Its configuration comes from Algorithm 2, so activation recomputation per stage is part of
        its plan (``fit_memory``); DIP's memory answer is its in-flight window (``dip-greedy-mem``)."""
        return self.config != CONFIG_DIP

    @property
    def ours(self) -> bool:
        """Entrain's own (it accepts Entrain's extensions), not a baseline."""
        return bool(self.extensions)

    def ranks_per_replica(self, encoder_stages: int, llm_stages: int) -> int:
        return encoder_stages if self.colocated else encoder_stages + llm_stages


_OURS = dict(extensions=EXTENSIONS, stage_chains=True, replannable=True)

SYSTEMS: dict[str, SystemSpec] = {
    s.name: s
    for s in (
        SystemSpec(
            ENTRAIN, assign_entrain, entrain.generate, "disjoint", CONFIG_ENTRAIN,
            default_in=("simulate", "assign"), **_OURS,
        ),
        SystemSpec(
            ENTRAIN_1F1B, assign_entrain, partial(entrain.generate, eager=False), "disjoint", CONFIG_ENTRAIN,
            default_in=("simulate",), **_OURS,
        ),
        SystemSpec(
            ONE_F_ONE_B, assign_1f1b, one_f_one_b.generate, "disjoint", CONFIG_ENTRAIN,
            default_in=("simulate", "assign"),
        ),
        SystemSpec(
            DISTTRAIN, assign_disttrain, one_f_one_b.generate, "disjoint", CONFIG_DISTTRAIN,
            default_in=("simulate", "assign"),
        ),
        SystemSpec(
            DISTTRAIN_PAPER, assign_disttrain, one_f_one_b.generate, "disjoint", CONFIG_DISTTRAIN_PAPER
        ),
        SystemSpec(DIP, assign_dip, dip.generate, "colocated", CONFIG_DIP, default_in=("simulate", "assign")),
        SystemSpec(DIP_GREEDY, assign_dip, dip_greedy.generate, "colocated", CONFIG_DIP, default_in=("simulate",)),
        SystemSpec(DIP_GREEDY_MEM, assign_dip, dip_greedy.generate, "colocated", CONFIG_DIP),
        SystemSpec(
            ENCODER_REBALANCE, assign_encoder_rebalance, one_f_one_b.generate, "disjoint", CONFIG_DISTTRAIN,
            cross_replica_moves=True,
        ),
        SystemSpec(DFLOP, assign_dflop, one_f_one_b.generate, "disjoint", CONFIG_DFLOP),
    )
}  # fmt: skip


def get_system(name: str) -> SystemSpec:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ConfigError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}") from None


def systems_where(prop: str) -> tuple[str, ...]:
    """The registry's systems (in its order) whose ``SystemSpec`` field or property ``prop`` is true."""
    return tuple(n for n, spec in SYSTEMS.items() if getattr(spec, prop))


def moves_across_replicas(system: str, options: ScheduleOptions | dict | None = None) -> bool:
    """Whether ``system``'s plans under ``options`` may move encoder work across data-parallel replicas:
    its ``cross_replica_moves``, or Entrain's ``encoder_rebalance`` option. The one place the runtime
    and the tests ask (the runtime then builds and checks the channels between replicas)."""
    spec = get_system(system)
    option = ScheduleOptions.from_any(options).encoder_rebalance  # True, or "auto" / "on" before deciding
    return spec.cross_replica_moves or (spec.ours and bool(option) and option != "off")


def default_systems(command: str) -> str:
    """``command``'s default ``--systems`` (a comma list, in the registry's order)."""
    return ",".join(n for n, spec in SYSTEMS.items() if command in spec.default_in)


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
    refuse_several_encoders(system, layout)
    gen = get_system(system).generator
    if cost is not None:  # the message parts a family declares besides the hidden states
        layout = cost.layout_with_parts(layout)
    opts = ScheduleOptions.from_any(options)
    plan = gen(layout, list(assignments), samples, cost, opts, system=system)
    return rebalance_plan(plan) if opts.encoder_rebalance else plan


def refuse_several_encoders(system: str, layout: Layout) -> None:
    """The registered systems plan one encoder component: a layout with several encoder pipelines is
    refused in one line (Entrain's plan for it: ``planning.encoders_plan.generate_encoders_plan``)."""
    if layout.multi_encoder:
        raise ConfigError(
            f"{system}: encoders {list(layout.encoder_names)} in separate pipelines are not planned by this "
            "system yet (one encoder component only; Entrain's is planning.encoders_plan)"
        )


def stage_times_fn(costs: PlanCosts):
    """For the DistTrain batcher: a microbatch's samples -> ``(2, S)`` forward/backward ms per
    stage of ``costs.layout`` (one call each, per-call constants included). Its ``encoder_stages``
    attribute says how many of the columns are encoder stages (the rebalancing and DFLOP batchers
    price the two modules apart)."""

    def times(samples: Sequence[SampleWork]) -> np.ndarray:
        ids = [s.id for s in samples]
        n = len(costs.layout.stages)
        fwd = [costs.compute_ms(s, ActionKind.F, ids) for s in range(n)]
        bwd = [costs.compute_ms(s, ActionKind.B, ids) for s in range(n)]
        return np.array([fwd, bwd])

    times.encoder_stages = costs.layout.num_encoder_stages
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
    refuse_several_encoders(system, layout)
    samples = {s.id: s for batch in batches for s in batch}
    costs = PlanCosts(layout, cost, samples)
    times = stage_times_fn(costs)
    assignments = [
        spec.batcher(list(b), layout.dp, layout.num_microbatches, stage_times=times) for b in batches
    ]
    return generate_plan(system, layout, assignments, samples, cost, options)
