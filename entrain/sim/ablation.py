"""Where a system's edge comes from, one mechanism at a time, on the same batches (the reports
attribute DIP-greedy's edge through ablation rows). Used by ``entrain bench paper`` and
``benchmarks/workload_zoo.py``.

DIP-greedy, step by step (each row changes one thing from the row before):

1. ``dip-greedy`` as it runs: colocated chunks, sub-microbatches, an unbounded in-flight window
   (it may not fit device memory);
2. ``dip-greedy-mem``: the in-flight window chosen to fit (equal memory);
3. the same without sub-microbatches (caps above any microbatch: one call per microbatch and stage);
4. the same on one model chunk per rank (Algorithm 2's one-stage-per-rank layout of ``1f1b``,
   without its recomputation) instead of two colocated chunks.

Entrain's assignment: the run's plan re-generated with the paper's assignment (Algorithm 3) in place
of its two-resource / auto choice, same layout and options otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields, replace

from entrain.core.costs.costmodel import CostModel
from entrain.core.schedules.common import ScheduleOptions
from entrain.core.systems import DIP_GREEDY, DIP_GREEDY_MEM, ONE_F_ONE_B
from entrain.core.workload.work import SampleWork
from entrain.sim.run import SystemRun, run_system

__all__ = [
    "ABLATED",
    "DIP_GREEDY_STEPS",
    "NO_SUB_MICROBATCHES",
    "dip_greedy_ablation",
    "paper_assignment_run",
    "schedule_options",
]

ABLATED = (DIP_GREEDY, DIP_GREEDY_MEM, ONE_F_ONE_B)
"""The systems ``dip_greedy_ablation`` needs the runs of."""
DIP_GREEDY_STEPS = (
    f"{DIP_GREEDY} (unbounded memory)",
    f"{DIP_GREEDY_MEM} (equal memory)",
    f"{DIP_GREEDY_MEM}, no sub-microbatches",
    f"{DIP_GREEDY_MEM}, one chunk per rank",
)
NO_SUB_MICROBATCHES = {"dip_encoder_cap_patches": 1e18, "dip_llm_cap_tokens": 1e18}
"""DIP caps above any microbatch: every microbatch runs as one sub-microbatch."""

_OPTION_FIELDS = {f.name for f in fields(ScheduleOptions)}


def schedule_options(run: SystemRun) -> dict:
    """The ``ScheduleOptions`` a run's plan was generated with (its recorded choices dropped)."""
    return {k: v for k, v in run.plan.options.items() if k in _OPTION_FIELDS}


def dip_greedy_ablation(
    runs: Mapping[str, SystemRun], batches: Sequence[Sequence[SampleWork]], cost: CostModel
) -> dict[str, SystemRun]:
    """``DIP_GREEDY_STEPS`` -> run; needs the runs of ``dip-greedy``, ``dip-greedy-mem`` and ``1f1b``
    on ``batches``."""
    mem = runs[DIP_GREEDY_MEM]
    caps = {k: v for k, v in schedule_options(mem).items() if k.startswith("dip_")}
    one_chunk = runs[ONE_F_ONE_B].layout
    one_chunk = replace(one_chunk, stages=tuple(replace(s, recompute="none") for s in one_chunk.stages))
    steps = (
        runs[DIP_GREEDY],
        mem,
        run_system(
            DIP_GREEDY_MEM, mem.layout, batches, cost, {**caps, **NO_SUB_MICROBATCHES}, trace_iterations=0
        ),
        run_system(DIP_GREEDY_MEM, one_chunk, batches, cost, {}, trace_iterations=0),
    )
    return dict(zip(DIP_GREEDY_STEPS, steps))


def paper_assignment_run(
    run: SystemRun, batches: Sequence[Sequence[SampleWork]], cost: CostModel
) -> SystemRun:
    """Entrain's ``run`` re-generated with the paper's assignment, same layout and other options."""
    options = {**schedule_options(run), "assignment": "paper"}
    return run_system(run.system, run.layout, batches, cost, options, trace_iterations=0)
