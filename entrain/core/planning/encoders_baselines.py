"""Baselines with several encoders, each in its own way (docs/design.md, "N encoders").

* **DistTrain-like** (``generate_disttrain_encoders_plan``): one parallel group per encoder (its
  disaggregated modules), the degrees from the N-way search (``search_encoders``) on its one profiled
  sample (``disttrain_encoders_sample``: the lower median of the summed encoder work : LLM work ratio,
  stable on (ratio, id)); each global batch by its batcher (``assign_disttrain``: data-order global
  microbatches dealt to replicas longest-first on the *summed* encoder cost, then the greedy
  reordering), whose analytic 1F1B makespan sees one chain of stages: the batch's bottleneck encoder
  pipeline (the largest summed stage time over the batch; ties: the first) then the LLM's
  (``bottleneck_chain``); run as 1F1B at each stage's depth (``encoders_plan.encoders_compute``).
* **1F1B**: both towers in the first (encoder) stages as one encoder component whose work is both
  towers', which is the one-encoder path as the Omni family plans today (``SampleMeta.encoder_units``
  prices a clip's chunks as rows of the vision tower's layers): nothing here.
* **DIP-like**: not built; the registered ``dip`` refuses a layout with several encoder pipelines
  (``systems.refuse_several_encoders``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from entrain.core.assignment.batchers.disttrain import assign_disttrain
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.ir.plan import ActionKind, Layout, Plan
from entrain.core.planning.encoders import Encoder, MultiEncoderConfig, encoder_works, search_encoders
from entrain.core.planning.encoders_plan import encoders_compute, encoders_layout, generate_encoders_plan
from entrain.core.schedules.common import build_plan, plain_specs
from entrain.core.schedules.encoder_costs import EncodersPlanCosts
from entrain.core.systems import DISTTRAIN, ENTRAIN, ONE_F_ONE_B
from entrain.core.workload.work import SampleWork

__all__ = [
    "disttrain_encoders_sample",
    "disttrain_encoders_config",
    "bottleneck_chain",
    "generate_disttrain_encoders_plan",
    "plan_encoders_system",
]


def disttrain_encoders_sample(samples: Sequence, encoders: Sequence[Encoder]):
    """DistTrain's one profiled sample with several encoders: the lower median of the summed encoder
    work : LLM work ratio (stable sort on (ratio, id)); its ``SampleMeta``."""
    works = encoder_works(samples, encoders)
    if not works:
        raise ConfigError("DistTrain profiles one sample of the draw: the draw is empty")
    order = sorted(works, key=lambda w: (w.encoder / max(w.llm, 1e-300), w.id))
    return order[(len(order) - 1) // 2].meta


def disttrain_encoders_config(
    samples: Sequence, encoders: Sequence[Encoder], parallel: ParallelConfig
) -> MultiEncoderConfig:
    """The N-way search's best configuration on the one profiled sample."""
    return search_encoders([disttrain_encoders_sample(samples, encoders)], encoders, parallel)[0]


def bottleneck_chain(costs: EncodersPlanCosts, ids: Sequence[str]) -> tuple[int, ...]:
    """The stages the batcher's makespan sees: the encoder pipeline with the largest summed forward +
    backward time over ``ids`` (ties: the first), then the LLM's stages."""
    layout: Layout = costs.layout
    ids = tuple(ids)

    def total(group: tuple[int, ...]) -> float:
        return sum(costs.compute_ms(s, k, ids) for s in group for k in (ActionKind.F, ActionKind.B))

    groups = layout.encoder_groups
    best = max(range(len(groups)), key=lambda i: (total(groups[i]), -i))
    llm = tuple(s.stage for s in layout.stages if s.component == "llm")
    return groups[best] + llm


def generate_disttrain_encoders_plan(
    batches: Sequence[Sequence],
    encoders: Sequence[Encoder],
    cfg: MultiEncoderConfig,
    *,
    system: str = DISTTRAIN,
) -> Plan:
    """One iteration per global batch (samples with token metadata) on ``cfg``
    (``disttrain_encoders_config``, say): DistTrain's batcher, 1F1B (module docstring)."""
    layout = encoders_layout(cfg)
    batch_works = []
    samples: dict[str, SampleWork] = {}
    for batch in batches:
        works = [
            SampleWork(w.id, w.encoder, w.llm, w.meta, w.encoders) for w in encoder_works(batch, encoders)
        ]
        samples.update((w.id, w) for w in works)
        batch_works.append(works)
    costs = EncodersPlanCosts(layout, encoders, samples)
    assignments = []
    for works in batch_works:
        chain = bottleneck_chain(costs, [w.id for w in works])

        def times(mb: Sequence[SampleWork], chain=chain) -> np.ndarray:
            ids = tuple(s.id for s in mb)
            return np.array(
                [[costs.compute_ms(s, k, ids) for s in chain] for k in (ActionKind.F, ActionKind.B)]
            )

        assignments.append(assign_disttrain(works, cfg.dp, cfg.num_microbatches, stage_times=times))
    return build_plan(system, layout, assignments, samples, plain_specs, encoders_compute, {})


def plan_encoders_system(
    system: str,
    profile: Sequence,
    batches: Sequence[Sequence],
    encoders: Sequence[Encoder],
    parallel: ParallelConfig,
) -> Plan:
    """``system``'s Plan for a model with several encoders: Entrain's (``search_encoders`` on
    ``profile``, ``encoders_plan``) or DistTrain-like's (module docstring); any other system refuses in
    one line (1F1B plans both towers as one encoder component, the one-encoder path)."""
    if system == ENTRAIN:
        return generate_encoders_plan(batches, encoders, search_encoders(profile, encoders, parallel)[0])
    if system == DISTTRAIN:
        cfg = disttrain_encoders_config(profile, encoders, parallel)
        return generate_disttrain_encoders_plan(batches, encoders, cfg)
    if system == ONE_F_ONE_B:
        raise ConfigError(
            f"{system} with encoders {[e.name for e in encoders]}: it plans both towers as one encoder component "
            "in the first stages (the one-encoder path), not one pipeline per encoder"
        )
    raise ConfigError(
        f"{system}: encoders {[e.name for e in encoders]} in separate pipelines are not planned by this system "
        f"yet (built: {ENTRAIN}, {DISTTRAIN})"
    )
