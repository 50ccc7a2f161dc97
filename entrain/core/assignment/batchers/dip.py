"""DIP-like batching (docs/design.md §2): parent microbatches as ``1f1b`` (fixed size, data order), and
the size-capped cut of a parent microbatch into modality sub-microbatches that DIP's schedule
generators use (``cut_sub_microbatches``). ``dip`` and ``dip-greedy`` share this batching; they
differ only in the schedule (``entrain.core.schedules``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from entrain.core.assignment.batchers.onef1b import assign_1f1b
from entrain.core.errors import ConfigError
from entrain.core.ir.microbatches import IterationAssignment
from entrain.core.workload.work import SampleWork

__all__ = ["assign_dip", "cut_sub_microbatches"]


def assign_dip(
    batch: Sequence[SampleWork], dp: int, num_microbatches: int, **_: object
) -> IterationAssignment:
    """DIP's parent microbatches: identical to ``assign_1f1b``."""
    return assign_1f1b(batch, dp, num_microbatches)


def cut_sub_microbatches(
    ids: Sequence[str], work_of_id: Mapping[str, float] | Callable[[str], float], cap: float
) -> list[list[str]]:
    """Cut a parent microbatch into sub-microbatches of total work at most ``cap``.

    ``work_of_id`` gives a sample's size in the cap's unit (ViT patches for the encoder, LLM tokens
    for the LLM). Greedy in the given order: a sample joins the current sub-microbatch if the total
    stays ``<= cap``, else it opens the next one; a sample larger than ``cap`` forms a
    sub-microbatch alone. Every id appears exactly once, order preserved; an empty parent gives ``[]``.
    """
    if not cap > 0:
        raise ConfigError(f"sub-microbatch cap must be positive, got {cap}")
    size = work_of_id.__getitem__ if isinstance(work_of_id, Mapping) else work_of_id
    subs: list[list[str]] = []
    current: list[str] = []
    total = 0.0
    for s in ids:
        w = float(size(s))
        if current and total + w > cap:
            subs.append(current)
            current, total = [], 0.0
        current.append(s)
        total += w
        if w > cap:  # over-cap sample: alone
            subs.append(current)
            current, total = [], 0.0
    if current:
        subs.append(current)
    return subs
