"""DistTrain-like batching (docs/design.md §2), shared by ``disttrain`` and ``disttrain-paper``.

1. Global microbatch ``m`` = samples ``[m*dp*U, (m+1)*dp*U)`` of the global batch (data order).
2. Its samples go to replicas by LPT on encoder work: sorted (encoder desc, id asc), each to the
   replica with the least encoder work among those holding fewer than ``U`` (ties: lowest index),
   so every replica gets exactly ``U`` samples of every global microbatch (DistTrain's
   intra-microbatch reordering).
3. Each replica then reorders its whole microbatches by greedy insertion (NEH): microbatches sorted
   by total stage time (desc, index asc) are inserted one by one at the position of the partial
   sequence that minimises the analytic 1F1B makespan (``onef1b_makespan``); ties go to the
   earliest position. This is our deterministic stand-in for DistTrain's unpublished
   inter-microbatch heuristic; reordering per replica (rather than one order for all replicas) is
   never worse for the recurrence, so the baseline is, if anything, favoured.

Per-stage times come from the caller (``stage_times``: a microbatch's samples -> per-stage
forward+backward ms, encoder stages then LLM stages, shape ``(S,)``; or forward and backward
separately, shape ``(2, S)``), typically a stage layout + cost model, so batching stays independent
of the planner. Without it, two stages (encoder, LLM) with the summed sample work are used. A
total is split 1:2 into forward:backward.

Cost: ``O(K^2 (K + S))`` numpy steps per replica (``K`` microbatches, ``S`` stages).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from entrain.core.assignment.batchers.common import StageTimes, check_fixed_size, plain_replica
from entrain.core.assignment.batchers.makespan import onef1b_makespan
from entrain.core.assignment.dp_split import check_batch, sort_desc
from entrain.core.ir.microbatches import IterationAssignment
from entrain.core.workload.work import SampleWork

__all__ = [
    "StageTimes",
    "default_stage_times",
    "lpt_global_microbatch",
    "reorder_microbatches",
    "fwd_bwd",
    "assign_disttrain",
]

BACKWARD_SHARE = 2.0 / 3.0


def default_stage_times(samples: Sequence[SampleWork]) -> np.ndarray:
    """Two stages: the microbatch's summed encoder work and summed LLM work (fwd+bwd)."""
    return np.array([sum(s.encoder for s in samples), sum(s.llm for s in samples)])


def fwd_bwd(times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward per-stage ms of ``stage_times``' answer (a total split 1:2)."""
    times = np.asarray(times, dtype=float)
    if times.ndim == 2:
        return times[0], times[1]
    return times * (1.0 - BACKWARD_SHARE), times * BACKWARD_SHARE


def lpt_global_microbatch(
    samples: Sequence[SampleWork], dp: int, key: str = "encoder"
) -> list[list[SampleWork]]:
    """Split one global microbatch of ``dp * U`` samples into ``dp`` groups of ``U`` by LPT on ``key``
    work (DistTrain: the encoder's; ``encoder-rebalance``'s owners: the LLM's)."""
    u = len(samples) // dp
    groups: list[list[SampleWork]] = [[] for _ in range(dp)]
    load = [0.0] * dp
    for s in sort_desc(samples, key):
        r = min((i for i in range(dp) if len(groups[i]) < u), key=lambda i: (load[i], i))
        groups[r].append(s)
        load[r] += getattr(s, key)
    return groups


def reorder_microbatches(fwd_ms: np.ndarray, bwd_ms: np.ndarray) -> list[int]:
    """Greedy-insertion order of microbatches (rows of ``(K, S)`` forward/backward times)."""
    k = fwd_ms.shape[0]
    total = (fwd_ms + bwd_ms).sum(axis=1)
    seq: list[int] = []
    for mb in sorted(range(k), key=lambda i: (-total[i], i)):
        cands = np.array([seq[:p] + [mb] + seq[p:] for p in range(len(seq) + 1)])
        spans = onef1b_makespan(fwd_ms[cands], bwd_ms[cands])
        best = int(np.argmin(spans))  # first minimum = earliest position
        seq.insert(best, mb)
    return seq


def assign_disttrain(
    batch: Sequence[SampleWork],
    dp: int,
    num_microbatches: int,
    *,
    stage_times: StageTimes | None = None,
    **_: object,
) -> IterationAssignment:
    """DistTrain-like assignment of one global batch (see module docstring)."""
    check_batch(batch, dp, num_microbatches)
    u = check_fixed_size(len(batch), dp, num_microbatches)
    times_of = stage_times or default_stage_times
    per_replica: list[list[list[SampleWork]]] = [[] for _ in range(dp)]
    for m in range(num_microbatches):
        for r, group in enumerate(lpt_global_microbatch(batch[m * dp * u : (m + 1) * dp * u], dp)):
            per_replica[r].append(group)
    replicas = []
    for mbs in per_replica:
        pairs = [fwd_bwd(times_of(mb)) for mb in mbs]
        fwd, bwd = np.array([f for f, _ in pairs]), np.array([b for _, b in pairs])
        replicas.append(plain_replica(mbs, reorder_microbatches(fwd, bwd)))
    return IterationAssignment(tuple(replicas))
