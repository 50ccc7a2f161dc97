"""Batchers: one global batch -> ``IterationAssignment`` (per-replica encoder/LLM microbatches,
execution order, deferrals). Every batcher has the signature
``batcher(batch: Sequence[SampleWork], dp: int, num_microbatches: int, *, stage_times=None)``;
``stage_times`` (a microbatch's samples -> per-stage ms) is used by the DistTrain batcher only and
ignored by the others. ``BATCHERS`` maps each system name of CONTRACT.md to its batcher; systems
that differ only in schedule or config share one (``entrain-1f1b`` = ``entrain``,
``disttrain-paper`` = ``disttrain``, ``dip-greedy`` = ``dip``).
"""

from __future__ import annotations

from collections.abc import Callable

from entrain.core.assignment.hierarchical import assign_entrain
from entrain.core.assignment.types import IterationAssignment
from entrain.core.batching.dip import assign_dip, cut_sub_microbatches
from entrain.core.batching.disttrain import assign_disttrain, default_stage_times
from entrain.core.batching.onef1b import assign_1f1b

__all__ = [
    "BATCHERS",
    "Batcher",
    "assign_1f1b",
    "assign_dip",
    "assign_disttrain",
    "assign_entrain",
    "cut_sub_microbatches",
    "default_stage_times",
    "get_batcher",
]

Batcher = Callable[..., IterationAssignment]

BATCHERS: dict[str, Batcher] = {
    "entrain": assign_entrain,
    "entrain-1f1b": assign_entrain,
    "1f1b": assign_1f1b,
    "disttrain": assign_disttrain,
    "disttrain-paper": assign_disttrain,
    "dip": assign_dip,
    "dip-greedy": assign_dip,
}


def get_batcher(system: str) -> Batcher:
    """The batcher of ``system``; ``ConfigError`` naming the known systems otherwise."""
    from entrain.core.errors import ConfigError

    try:
        return BATCHERS[system]
    except KeyError:
        raise ConfigError(f"unknown system {system!r}; choose from {', '.join(BATCHERS)}") from None
