"""``encoder-rebalance``: DistTrain's encoder/LLM split with the encoder inputs rebalanced across the
data-parallel replicas every iteration (VeOmni's encoder data balance, MegaScale-Omni's
adaptive encoder resharding, LoongForge's DP balancing, OrchMLLM): an all-to-all moves encoder inputs
between replicas so every replica's vision work is equal, and a second one returns the features to
the replica that owns each sample before its LLM runs (their gradients go back the same way).

Per global microbatch ``m`` (samples ``[m*dp*U, (m+1)*dp*U)``, data order, as DistTrain's):

1. Owners: ``U`` samples per replica by LPT on LLM work (sorted LLM desc, id asc; each to the replica
   with the least LLM work among those holding fewer than ``U``; ties: lowest index). The replica's
   LLM microbatch ``m`` is its owned samples.
2. Encoder rebalancing: start from the owners, then repeatedly move one sample from the replica with
   the most encoder work to the one with the least, or swap one of each, whichever leaves the smaller
   of the two loads' maximum (it must strictly lower the pair's larger load), until none helps. A replica keeps at
   least one of its own samples on its own encoder, so its LLM microbatch always waits for its own
   encoder message (``ir.graph`` routes by id within a replica; see below).
3. One execution order for all replicas (the all-to-all is collective per global microbatch): the
   greedy insertion of DistTrain's batcher (``disttrain.reorder_microbatches``) on per-stage times that
   are, per microbatch and stage, the largest over the replicas (encoder stages from the replica's
   encoder samples, LLM stages from its owned samples).

In the Plan, replica ``r``'s encoder microbatch ``m`` holds the samples its encoder computes and its
LLM microbatch ``m`` the samples it owns (``ReplicaAssignment.encoder_microbatches`` /
``llm_microbatches``); a sample whose two replicas differ crosses replicas at the boundary. The
simulator runs replicas independently: the boundary message of replica ``r`` carries the features of
every sample its encoder computed (the all-to-all's send volume of that rank), and an LLM microbatch
waits for its own replica's encoder microbatch, which, every replica's encoder load being balanced,
ends when the others do (what it does not wait for: the other replicas' lateness, bounded by the
residual imbalance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from entrain.core.assignment.batchers.common import StageTimes, check_fixed_size
from entrain.core.assignment.batchers.disttrain import (
    default_stage_times,
    fwd_bwd,
    lpt_global_microbatch,
    reorder_microbatches,
)
from entrain.core.assignment.dp_split import check_batch
from entrain.core.ir.microbatches import IterationAssignment, ReplicaAssignment
from entrain.core.workload.work import SampleWork

__all__ = ["rebalance_encoder", "assign_encoder_rebalance", "moved_samples"]


def _local(group: list[SampleWork], own: set[str]) -> int:
    return sum(1 for s in group if s.id in own)


def _best_exchange(
    hi: list[SampleWork], lo: list[SampleWork], gap: float, own_hi: set[str], own_lo: set[str]
):
    """The move of one sample of ``hi`` to ``lo``, or swap of one of each, that most lowers the pair's
    larger load (None: none lowers it); neither replica gives away the last of its own samples."""
    best, best_key = None, None
    last_hi, last_lo = _local(hi, own_hi) <= 1, _local(lo, own_lo) <= 1
    for a in hi:
        if a.id in own_hi and last_hi:
            continue
        for b in (None, *lo):
            if b is not None and b.id in own_lo and last_lo:
                continue
            delta = a.encoder - (b.encoder if b is not None else 0.0)
            if not 0.0 < delta < gap:
                continue
            key = (max(gap - delta, delta), a.id, "" if b is None else b.id)
            if best_key is None or key < best_key:
                best, best_key = (a, b), key
    return best


def rebalance_encoder(owners: Sequence[Sequence[SampleWork]]) -> list[list[SampleWork]]:
    """Per replica, the samples its encoder computes: the owners' groups with single samples moved, or
    pairs swapped, between the most and the least loaded replica while that lowers the pair's larger
    encoder load (step 2 of the module docstring). Deterministic."""
    enc = [list(g) for g in owners]
    own = [{s.id for s in g} for g in owners]
    load = [math.fsum(s.encoder for s in g) for g in enc]
    for _ in range(sum(len(g) for g in enc) * len(enc)):  # each exchange lowers the sorted loads
        hi = max(range(len(enc)), key=lambda r: (load[r], -r))
        lo = min(range(len(enc)), key=lambda r: (load[r], r))
        step = None if hi == lo else _best_exchange(enc[hi], enc[lo], load[hi] - load[lo], own[hi], own[lo])
        if step is None:
            break
        a, b = step
        enc[hi].remove(a)
        enc[lo].append(a)
        load[hi] -= a.encoder
        load[lo] += a.encoder
        if b is not None:
            enc[lo].remove(b)
            enc[hi].append(b)
            load[lo] -= b.encoder
            load[hi] += b.encoder
    return enc


def moved_samples(assignment: IterationAssignment) -> dict[str, tuple[int, int]]:
    """Sample id -> (encoder replica, owner replica) of every sample computed off its owner."""
    enc_of = {
        s: r for r, rep in enumerate(assignment.replicas) for mb in rep.encoder_microbatches for s in mb
    }
    llm_of = {s: r for r, rep in enumerate(assignment.replicas) for mb in rep.llm_microbatches for s in mb}
    return {s: (enc_of[s], r) for s, r in llm_of.items() if enc_of.get(s, r) != r}


def _common_order(
    enc: list[list[list[SampleWork]]], llm: list[list[list[SampleWork]]], times_of, encoder_stages: int | None
) -> list[int]:
    """Step 3: one greedy-insertion order from the per-(microbatch, stage) maxima over replicas."""
    fwd_rows, bwd_rows = [], []
    for m in range(len(enc[0])):
        per = []
        for r in range(len(enc)):
            fe, be = fwd_bwd(times_of(enc[r][m]))
            fl, bl = fwd_bwd(times_of(llm[r][m]))
            e = len(fe) // 2 if encoder_stages is None else encoder_stages
            per.append((np.concatenate([fe[:e], fl[e:]]), np.concatenate([be[:e], bl[e:]])))
        fwd_rows.append(np.max([f for f, _ in per], axis=0))
        bwd_rows.append(np.max([b for _, b in per], axis=0))
    return reorder_microbatches(np.array(fwd_rows), np.array(bwd_rows))


def assign_encoder_rebalance(
    batch: Sequence[SampleWork],
    dp: int,
    num_microbatches: int,
    *,
    stage_times: StageTimes | None = None,
    encoder_stages: int | None = None,
    **_: object,
) -> IterationAssignment:
    """The assignment of one global batch (module docstring). ``encoder_stages``: how many of
    ``stage_times``' columns are encoder stages (None: half, as ``default_stage_times``' two)."""
    check_batch(batch, dp, num_microbatches)
    encoder_stages = encoder_stages or getattr(stage_times, "encoder_stages", None)
    u = check_fixed_size(len(batch), dp, num_microbatches)
    times_of = stage_times or default_stage_times
    enc: list[list[list[SampleWork]]] = [[] for _ in range(dp)]
    llm: list[list[list[SampleWork]]] = [[] for _ in range(dp)]
    for m in range(num_microbatches):
        owners = lpt_global_microbatch(batch[m * dp * u : (m + 1) * dp * u], dp, "llm")
        for r, (e, o) in enumerate(zip(rebalance_encoder(owners), owners)):
            enc[r].append(e)
            llm[r].append(o)
    order = tuple(_common_order(enc, llm, times_of, encoder_stages))
    replicas = []
    for r in range(dp):
        replicas.append(
            ReplicaAssignment(
                k_eff=num_microbatches,
                encoder_microbatches=tuple(tuple(s.id for s in mb) for mb in enc[r]),
                llm_microbatches=tuple(tuple(s.id for s in mb) for mb in llm[r]),
                execution_order=order,
                encoder_work=tuple(math.fsum(s.encoder for s in mb) for mb in enc[r]),
                llm_work=tuple(math.fsum(s.llm for s in mb) for mb in llm[r]),
            )
        )
    return IterationAssignment(tuple(replicas))
