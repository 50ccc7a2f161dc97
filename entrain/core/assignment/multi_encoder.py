"""Microbatches for a model with several encoders (vision and audio, say) feeding one LLM.

Each encoder runs in its own pipeline group, so a microbatch has one load per encoder and the
slowest encoder group sets the pace. The stratified assignment of ``stratified`` balances one encoder
load; here every encoder's load is balanced at once (docs/design.md, "N encoders").

Pinned:

* A sample's work is a vector: its forward + backward work on each encoder (``EncoderWork.encoders``)
  and on the LLM. ``weights[e]`` turns encoder ``e``'s work into time on its group (1 / its GPUs
  under a proportional split; default 1): a sample's *size* is its largest weighted encoder work.
* ``K_eff``: the paper's rule (``stratified.effective_num_microbatches``) on the *bottleneck* encoder,
  the one with the largest weighted total (ties: the lowest index). An encoder whose samples are
  rare (a few images among many audio clips) does not cap the microbatch count.
* Coarse set = LLM work strictly above the replica's median, fine set = the rest (as the paper);
  each sorted on (size descending, id ascending); list scheduling coarse then fine. Each sample goes
  to the microbatch whose largest weighted encoder load after adding it is least; ties: the least
  summed weighted load after adding it, then the least summed load before it, then fewer samples,
  then the lowest index. With one encoder this is exactly ``stratified.stratified_assign`` (the same
  choice at every step: adding a sample is monotone in floating point).
* Bound (tested): every microbatch's weighted load on every encoder is at most
  ``S / K_eff + s_max``, ``S`` the replica's summed weighted work over all encoders and ``s_max``
  the largest sample size: when a sample is placed, the microbatch with the least summed load has
  every encoder load at most ``S / K_eff``, and the chosen one ends no higher than that one would.
* DP split: the paper's (``dp_split``) with the size for the encoder work: samples by (size
  descending, id ascending), each to the replica with the least LLM work among those with room
  (exactly ``B / dp`` each; ties: the lowest index). With one encoder it is ``dp_split.split_dp``.
* Deferral: LLM work only (``hierarchical.replica_assignment``), so every encoder's microbatches stay
  as assigned; ``ReplicaAssignment.encoder_work`` holds each microbatch's summed (unweighted) work
  over the encoders and ``MultiEncoderAssignment.encoder_loads`` the per-encoder loads.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from entrain.core.assignment.deferral import NUM_BUCKETS
from entrain.core.assignment.dp_split import check_batch
from entrain.core.assignment.hierarchical import replica_assignment
from entrain.core.assignment.stratified import microbatch_count
from entrain.core.errors import ConfigError
from entrain.core.ir.microbatches import ReplicaAssignment
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork

__all__ = [
    "EncoderWork",
    "MultiEncoderAssignment",
    "multi_encoder_k",
    "multi_encoder_lpt",
    "multi_encoder_assign",
    "assign_replica_multi_encoder",
    "microbatch_loads",
    "split_dp_multi_encoder",
    "assign_multi_encoder",
]


@dataclass(frozen=True, slots=True)
class EncoderWork:
    """One sample's forward + backward work on each encoder (in the planner's encoder order) and on
    the LLM, per-call constants excluded (``SampleWork`` with a vector of encoders)."""

    id: str
    encoders: tuple[float, ...]
    llm: float
    meta: SampleMeta | None = None

    def __post_init__(self) -> None:
        bad = [w for w in (*self.encoders, self.llm) if not (math.isfinite(w) and w >= 0.0)]
        if not self.encoders or bad:
            raise ConfigError(
                f"sample {self.id!r}: encoder work {list(self.encoders)}, LLM work {self.llm}: need at "
                "least one encoder and finite, non-negative work"
            )

    @property
    def encoder(self) -> float:
        """Summed work over the encoders."""
        return math.fsum(self.encoders)

    def as_sample_work(self) -> SampleWork:
        """The one-encoder view (summed encoder work), what deferral and the Plan IR take."""
        return SampleWork(self.id, self.encoder, self.llm, self.meta)


def _weights(samples: Sequence[EncoderWork], weights: Sequence[float] | None) -> np.ndarray:
    n_enc = {len(s.encoders) for s in samples}
    if len(n_enc) > 1:
        raise ConfigError(f"samples carry different numbers of encoders: {sorted(n_enc)}")
    n = n_enc.pop() if n_enc else (len(weights) if weights is not None else 1)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ConfigError(f"encoder weights {list(w)}: need {n} positive finite numbers")
    return w


def _weighted(samples: Sequence[EncoderWork], w: np.ndarray) -> np.ndarray:
    """``(n, encoders)``: each sample's weighted work on each encoder."""
    return np.array([s.encoders for s in samples], dtype=float).reshape(len(samples), len(w)) * w


def multi_encoder_k(
    samples: Sequence[EncoderWork],
    num_microbatches: int,
    weights: Sequence[float] | None = None,
    rule: str = "paper",
) -> int:
    """``K_eff``: the paper's rule on the bottleneck encoder (module docstring); ``rule`` ``"requested"``:
    the requested count, at most one per sample (``stratified.microbatch_count``)."""
    w = _weights(samples, weights)
    work = _weighted(samples, w)
    e = int(np.argmax(work.sum(axis=0))) if len(samples) else 0
    return microbatch_count([s.encoders[e] for s in samples], num_microbatches, rule)


def multi_encoder_lpt(
    samples: Sequence[EncoderWork], num_bins: int, weights: Sequence[float] | None = None
) -> list[list[EncoderWork]]:
    """Coarse-then-fine min-max list scheduling of ``samples`` into ``num_bins`` microbatches on the
    vector of weighted encoder loads (module docstring)."""
    if num_bins < 1:
        raise ConfigError(f"need at least one microbatch, got {num_bins}")
    w = _weights(samples, weights)
    work = _weighted(samples, w)
    size = work.max(axis=1, initial=0.0)
    median = float(np.median([s.llm for s in samples])) if samples else 0.0
    coarse = [i for i, s in enumerate(samples) if s.llm > median]
    fine = [i for i, s in enumerate(samples) if not s.llm > median]
    order = [i for part in (coarse, fine) for i in sorted(part, key=lambda i: (-size[i], samples[i].id))]
    loads = np.zeros((num_bins, len(w)))
    counts = np.zeros(num_bins)
    index = np.arange(num_bins)
    bins: list[list[EncoderWork]] = [[] for _ in range(num_bins)]
    for i in order:
        after = loads + work[i]
        key = np.lexsort((index, counts, loads.sum(axis=1), after.sum(axis=1), after.max(axis=1)))
        b = int(key[0])
        loads[b] = after[b]
        counts[b] += 1
        bins[b].append(samples[i])
    return bins


def multi_encoder_assign(
    samples: Sequence[EncoderWork],
    num_microbatches: int,
    weights: Sequence[float] | None = None,
    rule: str = "paper",
) -> list[list[EncoderWork]]:
    """One replica's encoder microbatches: ``multi_encoder_k`` bins (``K_eff`` by default) balancing
    every encoder's load."""
    return multi_encoder_lpt(samples, multi_encoder_k(samples, num_microbatches, weights, rule), weights)


def microbatch_loads(bins: Sequence[Sequence[EncoderWork]]) -> np.ndarray:
    """``(microbatches, encoders)``: each microbatch's summed (unweighted) work per encoder."""
    n_enc = next((len(s.encoders) for mb in bins for s in mb), 1)
    return np.array([[math.fsum(s.encoders[e] for s in mb) for e in range(n_enc)] for mb in bins]).reshape(
        len(bins), n_enc
    )


@dataclass(frozen=True, slots=True)
class MultiEncoderAssignment:
    """One replica's assignment: the one-encoder view (encoder microbatches, LLM microbatches after
    deferral, execution order) and each encoder microbatch's load per encoder."""

    replica: ReplicaAssignment
    encoder_loads: tuple[tuple[float, ...], ...]
    """Per encoder microbatch (``replica``'s indexing), its summed work on each encoder."""


def assign_replica_multi_encoder(
    samples: Sequence[EncoderWork],
    num_microbatches: int,
    weights: Sequence[float] | None = None,
    num_buckets: int = NUM_BUCKETS,
    rule: str = "paper",
) -> MultiEncoderAssignment:
    """Encoder microbatches balancing every encoder (``multi_encoder_assign``, ``rule`` its count's),
    then the paper's pairwise deferral of LLM work between them."""
    bins = multi_encoder_assign(samples, num_microbatches, weights, rule)
    replica = replica_assignment([[s.as_sample_work() for s in mb] for mb in bins], num_buckets)
    loads = microbatch_loads(bins)
    return MultiEncoderAssignment(replica, tuple(tuple(float(x) for x in row) for row in loads))


def split_dp_multi_encoder(
    batch: Sequence[EncoderWork], dp: int, weights: Sequence[float] | None = None
) -> list[list[EncoderWork]]:
    """``dp`` minibatches of exactly ``B / dp`` samples (module docstring), each in assignment order."""
    per_replica = check_batch([s.as_sample_work() for s in batch], dp)
    w = _weights(batch, weights)
    size = _weighted(batch, w).max(axis=1, initial=0.0)
    order = sorted(range(len(batch)), key=lambda i: (-size[i], batch[i].id))
    replicas: list[list[EncoderWork]] = [[] for _ in range(dp)]
    heap = [(0.0, r) for r in range(dp)]  # open replicas: (LLM load, index)
    for i in order:
        load, r = heapq.heappop(heap)
        replicas[r].append(batch[i])
        if len(replicas[r]) < per_replica:
            heapq.heappush(heap, (load + batch[i].llm, r))
    return replicas


def assign_multi_encoder(
    batch: Sequence[EncoderWork],
    dp: int,
    num_microbatches: int,
    weights: Sequence[float] | None = None,
    num_buckets: int = NUM_BUCKETS,
    rule: str = "paper",
) -> tuple[MultiEncoderAssignment, ...]:
    """One global batch: the DP split, then each replica's microbatches (``rule``: their count's,
    ``multi_encoder_k``) and deferral."""
    if num_microbatches < 1:
        raise ConfigError(f"num_microbatches must be >= 1, got {num_microbatches}")
    return tuple(
        assign_replica_multi_encoder(r, num_microbatches, weights, num_buckets, rule)
        for r in split_dp_multi_encoder(batch, dp, weights)
    )
