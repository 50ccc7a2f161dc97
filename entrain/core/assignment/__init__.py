"""Per-iteration microbatch assignment: Entrain's hierarchical algorithm (paper Algorithm 3), one
module per step: ``dp_split`` (replicas), ``stratified`` (K_eff + coarse/fine LPT encoder
microbatches), ``deferral`` (subset-sum DP, ``V``/``L``), ``matching`` (BottleneckMatch),
``hierarchical`` (the whole pipeline, ``assign_entrain``); ``two_resource`` (our extension: encoder
and LLM balanced together, ``assign_replica_two_resource``). Each system's batcher (one global batch
-> ``IterationAssignment``) is in ``batchers``; the data types are the Plan IR's
(``entrain.core.ir.microbatches``).

Attributes are imported lazily so that importing ``batchers`` stays cheap.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "assign_entrain": "hierarchical",
    "assign_replica": "hierarchical",
    "replica_assignment": "hierarchical",
    "plan_deferral": "hierarchical",
    "bottleneck_match": "matching",
    "split_dp": "dp_split",
    "stratified_assign": "stratified",
    "effective_num_microbatches": "stratified",
    "assign_replica_two_resource": "two_resource",
    "vector_lpt": "two_resource",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
