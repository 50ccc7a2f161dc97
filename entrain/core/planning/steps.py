"""One iteration's Plan at a time (no torch): what lets the runtime plan step N+1 while step N trains.

``plan_system(system, layout, batches, ...)`` plans every global batch at once. Its iterations are
independent but for two things, both handled here so that planning batch by batch gives the very
same Plan:

* run-wide options a generator derives from the first iteration (DIP's sub-microbatch caps from
  its first microbatch, ``RUN_WIDE_OPTIONS``): ``pinned_options`` reads them off the first batch's
  Plan and ``plan_step`` passes them back for every later batch;
* per-iteration records in ``Plan.options`` (Entrain's ``ramp_chosen``, ``pair_order_chosen``, ``assignment_chosen``,
  ``dp_split_chosen``, ``memory_split.cuts``, ``PER_ITERATION_OPTIONS``): ``join_plans``
  concatenates them.

So ``join_plans([plan_step(b, pinned) for b in batches]) == plan_system(batches)`` (tested for
every system, ``tests/core/test_plan_steps.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from entrain.core.costs.costmodel import CostModel
from entrain.core.ir.plan import Layout, Plan
from entrain.core.schedules.common import ScheduleOptions
from entrain.core.systems import plan_system
from entrain.core.workload.work import SampleWork

__all__ = ["RUN_WIDE_OPTIONS", "PER_ITERATION_OPTIONS", "pinned_options", "plan_step", "join_plans"]

RUN_WIDE_OPTIONS = ("dip_encoder_cap_patches", "dip_llm_cap_tokens")
"""``Plan.options`` (also ``ScheduleOptions`` fields) a generator derives from the first iteration
(``schedules.dip.dip_caps``)."""

PER_ITERATION_OPTIONS = ("ramp_chosen", "pair_order_chosen", "assignment_chosen", "dp_split_chosen")
"""``Plan.options`` lists with one entry per iteration (``schedules.entrain.generate``); the memory
split's ``cuts`` (under ``"memory_split"``) too."""


def pinned_options(first: Plan) -> dict:
    """The run-wide options the first global batch's Plan fixed (``RUN_WIDE_OPTIONS``)."""
    return {k: first.options[k] for k in RUN_WIDE_OPTIONS if k in first.options}


def plan_step(
    system: str,
    layout: Layout,
    batch: Sequence[SampleWork],
    cost: CostModel,
    options: ScheduleOptions | dict | None = None,
    pinned: dict | None = None,
) -> Plan:
    """The one-iteration Plan of ``batch``: iteration i of ``plan_system`` over all the run's batches
    when ``pinned`` is ``pinned_options`` of the first batch's Plan (None for the first batch)."""
    opts = ScheduleOptions.from_any(options)
    if pinned:
        opts = replace(opts, **pinned)
    return plan_system(system, layout, [batch], cost, opts)


def join_plans(parts: Sequence[Plan]) -> Plan:
    """One Plan of the iterations of ``parts`` in order (each planned by ``plan_step``)."""
    if not parts:
        raise ValueError("join_plans needs at least one Plan")
    first = parts[0]
    samples = {sid: w for p in parts for sid, w in p.samples.items()}
    options = {  # a memory split's per-iteration cuts are joined below; ``memory_split: False`` stays
        k: v
        for k, v in first.options.items()
        if k not in PER_ITERATION_OPTIONS and not (k == "memory_split" and isinstance(v, dict))
    }
    for key in PER_ITERATION_OPTIONS:
        if key in first.options:
            options[key] = [entry for p in parts for entry in p.options[key]]
    split = _joined_memory_split(parts)
    if split is not None:
        options["memory_split"] = split
    return Plan(
        system=first.system,
        layout=first.layout,
        iterations=tuple(it for p in parts for it in p.iterations),
        samples={sid: samples[sid] for sid in sorted(samples)},
        options=options,
    )


def _joined_memory_split(parts: Sequence[Plan]) -> dict | None:
    """``memory_split`` over all iterations: present when any iteration cut; an iteration without
    cuts contributes no cut on each of its replicas (as ``plan_system`` records it)."""
    with_split = [p.options["memory_split"] for p in parts if isinstance(p.options.get("memory_split"), dict)]
    if not with_split:
        return None
    cuts = []
    for p in parts:
        split = p.options.get("memory_split")
        cuts += (
            split["cuts"]
            if isinstance(split, dict)
            else [[[] for _ in range(p.layout.dp)] for _ in p.iterations]
        )
    return {**with_split[0], "cuts": cuts}
