"""Fixed-size data-order microbatches, the ``1f1b`` baseline (docs/design.md §2).

Replica ``r`` gets the ``r``-th contiguous block of ``B / dp`` samples of the global batch (data
order); its microbatches are consecutive runs of ``U = B / (dp * K)`` samples, executed in order.
Encoder and LLM microbatches hold the same samples; nothing is deferred.
"""

from __future__ import annotations

from collections.abc import Sequence

from entrain.core.assignment.batchers.common import check_fixed_size, plain_replica
from entrain.core.assignment.dp_split import check_batch
from entrain.core.ir.microbatches import IterationAssignment
from entrain.core.workload.work import SampleWork

__all__ = ["fixed_microbatches", "assign_1f1b"]


def fixed_microbatches(
    batch: Sequence[SampleWork], dp: int, num_microbatches: int
) -> list[list[list[SampleWork]]]:
    """``[replica][microbatch] -> samples`` in data order (see module docstring)."""
    per_replica = check_batch(batch, dp, num_microbatches)
    u = check_fixed_size(len(batch), dp, num_microbatches)
    blocks = [batch[r * per_replica : (r + 1) * per_replica] for r in range(dp)]
    return [[list(b[m * u : (m + 1) * u]) for m in range(num_microbatches)] for b in blocks]


def assign_1f1b(
    batch: Sequence[SampleWork], dp: int, num_microbatches: int, **_: object
) -> IterationAssignment:
    """The ``1f1b`` baseline's assignment of one global batch."""
    return IterationAssignment(
        tuple(plain_replica(r) for r in fixed_microbatches(batch, dp, num_microbatches))
    )
