"""Metrics of simulated iterations, exactly as docs/contract.md (``entrain simulate``) defines them.

Per iteration (then averaged over iterations):

* ``iteration_time_ms``: slowest pipeline rank over replicas + its DP all-reduce (``executor``).
* ``bubble_ratio`` = 1 - sum(busy) / (world size x iteration time).
* ``encoder_fwd_std_ms`` / ``llm_fwd_std_ms``: per executed microbatch, the forward time summed over
  that modality's stages and sub-microbatches (Entrain: both encoder subs; DIP: the parent);
  population std across a replica's microbatches; mean over (iteration, replica).
* ``ideal_ms`` = (K + p - 1) * t with p = pipeline ranks per replica, K the slowest replica's
  microbatch count, t = that replica's total compute / (K * p) (compute only); with several encoder
  pipelines the ``p - 1`` of the fill is the longest way through the ranks less one
  (``rank_chains``: each encoder pipeline's ranks then the LLM's).
* ``partition_ideal_ms``: 1F1B makespan over the system's pipeline ranks (a rank's stages
  together; one stage per rank except DIP) with every microbatch equal to the replica's mean
  per-rank forward and backward time; max over replicas (compute only); with several encoder
  pipelines, the most over the ways through the ranks.
* ``lower_bound_ms`` = max over ranks of busy time.
* ``peak_activation_bytes_per_rank``: per pipeline rank (index = pp rank within a replica), the
  peak over replicas and iterations; ``peak_activation_bytes`` = its max.
* Memory realism (additive keys): ``model_state_bytes_per_rank`` = weights + gradients + AdamW state
  of the rank's layers (``PlanCosts.model_state_bytes``: 18 bytes per trainable parameter, / TP);
  ``in_flight_message_bytes_per_rank`` = the most bytes of point-to-point messages the rank holds at
  one step of its program (``entrain.core.costs.memory.in_flight_message_bytes``: a send until its
  receive is provably posted, a receive until the compute that takes it); ``peak_memory_bytes_per_rank``
  = model state + the most the rank holds at one step of its program, activations and messages in
  flight together (``peak_with_messages``; the peak activation bytes where the plan is not given);
  ``fits_memory`` = every rank's total <= ``HardwareSpec.device_memory_bytes``. Timings are not changed by a misfit: a
  system that does not fit is reported as such (an OOM configuration could not run as simulated).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from entrain.core.costs.memory import in_flight_message_bytes, peak_with_messages, plan_message_bytes
from entrain.core.errors import ScheduleError
from entrain.core.ir.plan import IterationPlan, Layout
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.schedules.one_f_one_b import one_f_one_b_makespan
from entrain.sim.executor import IterationRun, ReplicaRun

__all__ = ["SystemMetrics", "compute_metrics", "per_microbatch_fwd_ms", "rank_chains"]


@dataclass
class SystemMetrics:
    iteration_time_ms: float
    iteration_time_ms_per_iter: list[float]
    bubble_ratio: float
    encoder_fwd_std_ms: float
    llm_fwd_std_ms: float
    peak_activation_bytes: float
    peak_activation_bytes_per_rank: list[float]
    ideal_ms: float
    partition_ideal_ms: float
    lower_bound_ms: float
    entrain_speedup: float | None = None
    model_state_bytes_per_rank: list[float] | None = None
    device_memory_bytes: float | None = None
    in_flight_message_bytes_per_rank: list[float] | None = None
    peak_held_bytes_per_rank: list[float] | None = None
    """Per pipeline rank: the most activation and in-flight message bytes held at one step."""

    @property
    def peak_memory_bytes_per_rank(self) -> list[float] | None:
        if self.model_state_bytes_per_rank is None:
            return None
        held = self.peak_held_bytes_per_rank or self.peak_activation_bytes_per_rank
        return [a + m for a, m in zip(held, self.model_state_bytes_per_rank)]

    @property
    def fits_memory(self) -> bool | None:
        peaks = self.peak_memory_bytes_per_rank
        if peaks is None or self.device_memory_bytes is None:
            return None
        return max(peaks, default=0.0) <= self.device_memory_bytes

    def memory_json(self) -> dict:
        if self.model_state_bytes_per_rank is None:
            return {}
        peaks = self.peak_memory_bytes_per_rank
        return {
            "model_state_bytes_per_rank": list(self.model_state_bytes_per_rank),
            **(
                {}
                if self.in_flight_message_bytes_per_rank is None
                else {"in_flight_message_bytes_per_rank": list(self.in_flight_message_bytes_per_rank)}
            ),
            "peak_memory_bytes_per_rank": peaks,
            "peak_memory_bytes": max(peaks, default=0.0),
            "device_memory_bytes": self.device_memory_bytes,
            "fits_memory": self.fits_memory,
        }

    def to_json(self) -> dict:
        return {
            "iteration_time_ms": self.iteration_time_ms,
            "iteration_time_ms_per_iter": list(self.iteration_time_ms_per_iter),
            "bubble_ratio": self.bubble_ratio,
            "encoder_fwd_std_ms": self.encoder_fwd_std_ms,
            "llm_fwd_std_ms": self.llm_fwd_std_ms,
            "peak_activation_bytes": self.peak_activation_bytes,
            "peak_activation_bytes_per_rank": list(self.peak_activation_bytes_per_rank),
            "ideal_ms": self.ideal_ms,
            "partition_ideal_ms": self.partition_ideal_ms,
            "lower_bound_ms": self.lower_bound_ms,
            "entrain_speedup": self.entrain_speedup,
            **self.memory_json(),
        }


def per_microbatch_fwd_ms(layout: Layout, run: ReplicaRun) -> tuple[list[float], list[float]]:
    """(encoder, LLM) forward ms per executed microbatch, summed over stages and subs."""
    e = layout.num_encoder_stages
    enc = [0.0] * run.num_microbatches
    llm = [0.0] * run.num_microbatches
    for (stage, mb, _), ms in run.fwd_ms.items():
        (enc if stage < e else llm)[mb] += ms
    return enc, llm


def rank_chains(layout: Layout) -> list[list[int]]:
    """The ways through a replica's pipeline ranks, in order: every rank in a one-encoder plan; with
    several encoder pipelines, each pipeline's ranks then the LLM's (they run side by side)."""
    if not layout.multi_encoder:
        return [list(range(layout.ranks_per_replica))]
    llm = [s.pp_rank for s in layout.stages if s.component == "llm"]
    chains = []
    for group in layout.encoder_groups:
        ranks = [layout.stages[s].pp_rank for s in group] + llm
        chains.append(list(dict.fromkeys(ranks)))
    return chains


def _partition_ideal(layout: Layout, run: ReplicaRun) -> float:
    """1F1B's makespan of the run's mean microbatch per rank along the longest way through the ranks."""
    k = run.num_microbatches
    p = layout.ranks_per_replica
    fwd, bwd = [0.0] * p, [0.0] * p
    for (stage, _, _), ms in run.fwd_ms.items():
        fwd[layout.stages[stage].pp_rank] += ms / k
    for (stage, _, _), ms in run.bwd_ms.items():
        bwd[layout.stages[stage].pp_rank] += ms / k
    if not layout.multi_encoder:
        return one_f_one_b_makespan(fwd, bwd, k)
    return max(one_f_one_b_makespan([fwd[r] for r in c], [bwd[r] for r in c], k) for c in rank_chains(layout))


def _iteration_metrics(layout: Layout, it: IterationRun) -> dict:
    world = layout.world_size
    busy = [b for run in it.replicas for b in run.busy_ms.values()]
    t = it.iteration_time_ms
    p = layout.ranks_per_replica
    slow = max(it.replicas, key=lambda r: (sum(r.busy_ms.values()), -r.replica))
    k = slow.num_microbatches
    per_stage_mb = sum(slow.busy_ms.values()) / (k * p) if k else 0.0
    depth = max(len(c) for c in rank_chains(layout))  # p in a one-encoder plan
    enc_std, llm_std = [], []
    for run in it.replicas:
        enc, llm = per_microbatch_fwd_ms(layout, run)
        enc_std.append(float(np.std(enc)) if enc else 0.0)
        llm_std.append(float(np.std(llm)) if llm else 0.0)
    return {
        "time": t,
        "bubble": 1.0 - sum(busy) / (world * t) if t > 0 else 0.0,
        "enc_std": float(np.mean(enc_std)),
        "llm_std": float(np.mean(llm_std)),
        "ideal": (k + depth - 1) * per_stage_mb,
        "partition_ideal": max(_partition_ideal(layout, run) for run in it.replicas),
        "lower_bound": max(busy),
    }


def _held_peaks(
    layout: Layout, iterations: list[IterationRun], plans: Sequence[IterationPlan], costs: PlanCosts
) -> tuple[list[float], list[float]]:
    """Per pipeline rank, over replicas and iterations: (the most message bytes in flight at one step,
    the most activation + message bytes at one step). An iteration that has no point-to-point program
    (``rank_program`` refuses it: encoder work moved across replicas onto a rank that also holds the
    LLM, which the runtime refuses too) counts each replica's own messages, without the moved
    samples' pieces."""
    p = layout.ranks_per_replica
    msgs, held = [0.0] * p, [0.0] * p
    for run_it, it in zip(iterations, plans):
        try:
            in_flight = in_flight_message_bytes(layout, it, plan_message_bytes(costs, it))
        except ScheduleError:  # each replica's own messages (a moved sample's piece: not counted)
            local = plan_message_bytes(costs, it, pieces={})
            in_flight = in_flight_message_bytes(layout, it, local, pieces={})
        for run in run_it.replicas:
            for g, peak in peak_with_messages(run.step_bytes, in_flight).items():
                r = layout.replica_of(g)[1]
                held[r] = max(held[r], peak)
                msgs[r] = max([msgs[r], *in_flight.get(g, ())])
    return msgs, held


def compute_metrics(
    layout: Layout,
    iterations: list[IterationRun],
    costs: PlanCosts | None = None,
    plans: Sequence[IterationPlan] | None = None,
) -> SystemMetrics:
    """Metrics of ``iterations``; with ``costs``, also the memory-realism keys, and with ``plans`` (the
    iterations' plans) the messages in flight in them."""
    rows = [_iteration_metrics(layout, it) for it in iterations]
    p = layout.ranks_per_replica
    peaks = [0.0] * p
    for it in iterations:
        for run in it.replicas:
            for g, peak in run.peak_bytes.items():
                r = layout.replica_of(g)[1]
                peaks[r] = max(peaks[r], peak)
    msgs, held = (
        _held_peaks(layout, iterations, plans, costs) if costs and plans is not None else (None, None)
    )

    def mean(key: str) -> float:
        return float(np.mean([r[key] for r in rows])) if rows else 0.0

    return SystemMetrics(
        iteration_time_ms=mean("time"),
        iteration_time_ms_per_iter=[r["time"] for r in rows],
        bubble_ratio=mean("bubble"),
        encoder_fwd_std_ms=mean("enc_std"),
        llm_fwd_std_ms=mean("llm_std"),
        peak_activation_bytes=max(peaks, default=0.0),
        peak_activation_bytes_per_rank=peaks,
        ideal_ms=mean("ideal"),
        partition_ideal_ms=mean("partition_ideal"),
        lower_bound_ms=mean("lower_bound"),
        model_state_bytes_per_rank=None if costs is None else [costs.model_state_bytes(r) for r in range(p)],
        device_memory_bytes=None if costs is None else costs.cost.hardware.device_memory_bytes,
        in_flight_message_bytes_per_rank=msgs,
        peak_held_bytes_per_rank=held,
    )
