"""Per-sample work: what the assignment algorithms balance.

``encoder`` and ``llm`` are forward + backward milliseconds of the whole component on one
replica (TP/CP as configured), per-call constants excluded (those are paid per microbatch call, see
``CostModel``). A raw-work JSONL gives these numbers directly, in the file's own units.
"""

from __future__ import annotations

from dataclasses import dataclass

from entrain.core.workload.samples import SampleMeta

__all__ = ["SampleWork"]


@dataclass(frozen=True, slots=True)
class SampleWork:
    id: str
    encoder: float
    llm: float
    meta: SampleMeta | None = None
    """Token metadata when known (workload files and generators); ``None`` for raw-work files."""
    encoders: tuple[float, ...] = ()
    """With several encoders: the work on each (the layout's encoder order; ``encoder`` is their sum);
    empty with one encoder."""

    @property
    def total(self) -> float:
        return self.encoder + self.llm
