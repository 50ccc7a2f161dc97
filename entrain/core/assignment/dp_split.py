"""DP-level sample distribution (paper §3, Algorithm 3 lines 1-2).

The global batch is sorted by encoder work, descending (stable on sample id ascending); each
sample in turn goes to the replica with the least accumulated **LLM** work among replicas that
still have room (exactly ``B / dp`` samples each); ties go to the lowest replica index.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from entrain.core.errors import ConfigError
from entrain.core.workload.work import SampleWork

__all__ = ["sort_desc", "check_batch", "split_dp"]


def sort_desc(samples: Sequence[SampleWork], key: str) -> list[SampleWork]:
    """Stable sort on (``getattr(s, key)`` descending, ``s.id`` ascending)."""
    return sorted(samples, key=lambda s: (-getattr(s, key), s.id))


def check_batch(batch: Sequence[SampleWork], dp: int, num_microbatches: int | None = None) -> int:
    """Validate a global batch for ``dp`` replicas; return the per-replica size ``B / dp``.

    Raises ``ConfigError`` for a non-positive ``dp``/``num_microbatches``, a batch size not divisible
    by ``dp``, duplicate sample ids, or negative / non-finite work.
    """
    if dp < 1:
        raise ConfigError(f"dp must be >= 1, got {dp}")
    if num_microbatches is not None and num_microbatches < 1:
        raise ConfigError(f"num_microbatches must be >= 1, got {num_microbatches}")
    if len(batch) == 0 or len(batch) % dp:
        raise ConfigError(f"global batch of {len(batch)} samples is not a positive multiple of dp={dp}")
    ids = [s.id for s in batch]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ConfigError(f"sample id {dup!r} occurs more than once in the global batch")
    work = np.array([(s.encoder, s.llm) for s in batch], dtype=float)
    if not np.all(np.isfinite(work)) or np.any(work < 0):
        bad = batch[int(np.argwhere(~np.isfinite(work) | (work < 0))[0, 0])]
        raise ConfigError(f"sample {bad.id!r} has negative or non-finite work ({bad.encoder}, {bad.llm})")
    return len(batch) // dp


def split_dp(batch: Sequence[SampleWork], dp: int) -> list[list[SampleWork]]:
    """Split ``batch`` into ``dp`` minibatches of exactly ``B / dp`` samples (see module docstring).

    Each minibatch lists its samples in the order they were assigned (encoder work descending).
    """
    per_replica = check_batch(batch, dp)
    replicas: list[list[SampleWork]] = [[] for _ in range(dp)]
    heap = [(0.0, r) for r in range(dp)]  # open replicas: (LLM load, index) = the tie-break order
    for s in sort_desc(batch, "encoder"):
        load, r = heapq.heappop(heap)
        replicas[r].append(s)
        if len(replicas[r]) < per_replica:
            heapq.heappush(heap, (load + s.llm, r))
    return replicas
