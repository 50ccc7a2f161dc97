"""Batchers: one global batch -> ``IterationAssignment`` (per-replica encoder/LLM microbatches,
execution order, deferrals). Every batcher is a ``common.Batcher``:
``batcher(batch, dp, num_microbatches, *, stage_times=None)``; ``stage_times`` (a microbatch's
samples -> per-stage ms) is used by the DistTrain batcher only and ignored by the others. Which
system uses which batcher is recorded in ``entrain.core.systems``.
"""

from __future__ import annotations

from entrain.core.assignment.batchers.dip import assign_dip, cut_sub_microbatches
from entrain.core.assignment.batchers.disttrain import assign_disttrain, default_stage_times
from entrain.core.assignment.batchers.onef1b import assign_1f1b
from entrain.core.assignment.hierarchical import assign_entrain

__all__ = [
    "assign_1f1b",
    "assign_dip",
    "assign_disttrain",
    "assign_entrain",
    "cut_sub_microbatches",
    "default_stage_times",
]
