"""Extension (ours, not the paper's): boundary sharing.

``boundary_sharing_config`` partitions the concatenated encoder-then-LLM layer list over a replica's
pipeline ranks in one min-max pass, so the rank where the modalities meet may hold the last encoder
stage and the first LLM stage (same TP x CP on both). Its Eq. 2 time is never above the disjoint
split's on the same ranks (the disjoint split is one of its candidate partitions);
``entrain.core.planning.setups`` uses it for Entrain where Eq. 2 is lower.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from entrain.core.costs.costmodel import COMPONENTS, RECOMPUTE_MODES, CostModel
from entrain.core.costs.memory import microbatch_load, recompute_ms, stage_memory_bytes
from entrain.core.costs.sampler import Item, SampleStats, has_costs, mean_layer_ms
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.ir.plan import ComponentLayout, Layout, StageSpec
from entrain.core.planning.partition import min_max_partition

__all__ = ["SharedBoundaryConfig", "boundary_sharing_config"]


@dataclass(frozen=True, slots=True)
class SharedBoundaryConfig:
    """Entrain's boundary-sharing layout: the ``ranks`` pipeline ranks of a replica cover the
    concatenated layer list (encoder layers, then LLM layers) by one min-max partition, so the rank
    where the modalities meet may hold the last encoder stage *and* the first LLM stage."""

    layout: Layout
    rank_ms: tuple[float, ...]
    """Forward + backward ms of the mean microbatch per pipeline rank (per-call constants included)."""
    rank_memory_bytes: tuple[float, ...]
    predicted_iteration_time_ms: float
    """Paper Eq. 2 over the ranks: ``sum(rank times) + (K - 1) * slowest rank``."""
    memory_ok: bool

    @property
    def shares_boundary(self) -> bool:
        return len(self.layout.stages) > self.layout.ranks_per_replica


def boundary_sharing_config(
    profile: Sequence[Item] | SampleStats,
    cost: CostModel,
    parallel: ParallelConfig,
    *,
    ranks: int,
) -> SharedBoundaryConfig:
    """One min-max partition (``partition.min_max_partition``) of the mean microbatch's per-layer
    forward + backward ms over the concatenated encoder-then-LLM layer list into ``ranks`` ranks
    (both components at the same ``tp`` x ``cp``, so a rank's GPUs can hold either). A rank whose
    range crosses the boundary gets two stages. Memory per rank as Algorithm 2's check. ``parallel``:
    DP (None: 1), TP, CP and the batch sizes."""
    stats = profile if isinstance(profile, SampleStats) else SampleStats.of(profile)
    if len(stats) == 0:
        raise ConfigError("the profile has no samples")
    dp, u, k = parallel.dp_or_1, parallel.microbatch_size, parallel.num_microbatches
    tp, cp = parallel.tp, parallel.cp
    for comp in COMPONENTS:
        if not has_costs(cost, comp, tp, cp):
            raise ConfigError(f"the cost model has no {comp} costs for tp={tp} cp={cp}")
    enc_ms = mean_layer_ms(stats, cost, "encoder", tp, cp, u)
    llm_ms = mean_layer_ms(stats, cost, "llm", tp, cp, u)
    ep = parallel.ep_or_1 if cost.has_experts("llm") else 1
    if cost.has_experts("llm"):  # the mean microbatch's busiest-rank expert tokens and all-to-all
        tokens = u * stats.column_summary("llm")[0] if stats.has_tokens else 0.0
        llm_ms = llm_ms + [
            sum(cost.expert_ms("llm", i, tokens, p, tp, cp, ep) for p in ("fwd", "bwd"))
            for i in range(len(llm_ms))
        ]
    n_enc = len(enc_ms)
    no_cut = cost.forbidden_cuts("encoder") | {n_enc + j for j in cost.forbidden_cuts("llm")}
    part = min_max_partition([*enc_ms.tolist(), *llm_ms.tolist()], ranks, no_cut)
    pieces: list[tuple[str, int, int, int]] = []  # (component, first, end, rank)
    for r, (f, e) in enumerate(part.ranges):
        if f < n_enc:
            pieces.append(("encoder", f, min(e, n_enc), r))
        if e > n_enc:
            pieces.append(("llm", max(f, n_enc) - n_enc, e - n_enc, r))
    pieces.sort(key=lambda p: (p[0] != "encoder", p[1]))
    stages = tuple(StageSpec(i, c, f, e, r) for i, (c, f, e, r) in enumerate(pieces))
    num_enc = sum(1 for p in pieces if p[0] == "encoder")
    layout = Layout(
        dp=dp,
        microbatch_size=u,
        num_microbatches=k,
        components={
            "encoder": ComponentLayout(tp, cp, num_enc),
            "llm": ComponentLayout(tp, cp, len(pieces) - num_enc, ep),
        },
        stages=stages,
    )
    limit = cost.hardware.device_memory_bytes
    modes, memory, rank_ms = _rank_recompute(stats, cost, pieces, list(part.stage_ms), tp, cp, u, ep)
    stages = tuple(replace(st, recompute=modes[st.pp_rank]) for st in stages)
    layout = replace(layout, stages=stages)
    t_iter = sum(rank_ms) + (k - 1) * max(rank_ms)
    ok = all(m <= limit for m in memory)
    return SharedBoundaryConfig(layout, tuple(rank_ms), tuple(memory), t_iter, ok)


def _rank_recompute(
    stats: SampleStats,
    cost: CostModel,
    pieces: list[tuple[str, int, int, int]],
    rank_ms: list[float],
    tp: int,
    cp: int,
    u: int,
    ep: int,
) -> tuple[dict[int, str], list[float], list[float]]:
    """Per rank, the cheapest recomputation mode that fits all its pieces (``(component, first, end,
    rank)``) in the device's memory (the last mode where none does), the memory it then holds and
    its ms with that recomputation added to ``rank_ms``."""
    ranks, limit = len(rank_ms), cost.hardware.device_memory_bytes
    memory, modes = [0.0] * ranks, {}
    for r in range(ranks):
        mine = [p for p in pieces if p[3] == r]
        for mode in RECOMPUTE_MODES:
            mem = sum(
                stage_memory_bytes(
                    cost,
                    c,
                    f,
                    e,
                    tp,
                    cp,
                    microbatch_load(stats, c, u),
                    ranks - r,
                    mode,
                    ep if c == "llm" else 1,
                )
                for c, f, e, _ in mine
            )
            if mem <= limit or mode == RECOMPUTE_MODES[-1]:
                break
        modes[r], memory[r] = mode, mem
        rank_ms[r] += sum(recompute_ms(stats, cost, c, f, e, tp, cp, u, mode) for c, f, e, _ in mine)
    return modes, memory, rank_ms
