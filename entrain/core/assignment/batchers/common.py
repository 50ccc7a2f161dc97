"""What every batcher shares: the ``Batcher`` signature (``SystemSpec.batcher``) and, for the
baseline batchers, building a deferral-free ``ReplicaAssignment``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from entrain.core.ir.microbatches import IterationAssignment, ReplicaAssignment
from entrain.core.ir.parallel import microbatch_size_for
from entrain.core.workload.work import SampleWork

__all__ = ["StageTimes", "Batcher", "plain_replica", "check_fixed_size"]

StageTimes = Callable[[Sequence[SampleWork]], Sequence[float] | np.ndarray]
"""A microbatch's samples -> per-stage ms (``(S,)``, or forward and backward ``(2, S)``)."""


class Batcher(Protocol):
    """One global batch -> per-replica encoder/LLM microbatches, execution order and deferrals.
    ``stage_times`` is used by the DistTrain batcher only and ignored by the others."""

    def __call__(
        self,
        batch: Sequence[SampleWork],
        dp: int,
        num_microbatches: int,
        *,
        stage_times: StageTimes | None = None,
    ) -> IterationAssignment: ...


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
