"""Helpers shared by the baseline batchers: building a deferral-free ``ReplicaAssignment``."""

from __future__ import annotations

import math
from collections.abc import Sequence

from entrain.core.assignment.types import ReplicaAssignment
from entrain.core.parallel import microbatch_size_for
from entrain.core.work import SampleWork

__all__ = ["plain_replica", "check_fixed_size"]


def check_fixed_size(batch_size: int, dp: int, num_microbatches: int) -> int:
    """Microbatch size ``U = B / (dp * K)`` for fixed-size batchers; ``ConfigError`` if not whole."""
    return microbatch_size_for(batch_size, dp, num_microbatches)


def plain_replica(
    microbatches: Sequence[Sequence[SampleWork]], execution_order: Sequence[int] | None = None
) -> ReplicaAssignment:
    """Same samples for encoder and LLM microbatches, no deferral; order defaults to 0..K-1."""
    ids = tuple(tuple(s.id for s in mb) for mb in microbatches)
    order = tuple(range(len(ids))) if execution_order is None else tuple(execution_order)
    return ReplicaAssignment(
        k_eff=len(ids),
        encoder_microbatches=ids,
        llm_microbatches=ids,
        execution_order=order,
        encoder_work=tuple(math.fsum(s.encoder for s in mb) for mb in microbatches),
        llm_work=tuple(math.fsum(s.llm for s in mb) for mb in microbatches),
    )
