"""Algorithm 2: the static configuration search.

Per component, every TP x CP with ``PP = floor(M/(TP*CP))`` and ``ceil(M/(TP*CP))`` (both tried, at
least 1, clamped to the component's layer count), combined so the replica's GPUs are not exceeded; a
1-D min-max layer partition per component (``partition.min_max_partition``) of the mean microbatch's
per-layer forward + backward times; score = paper Eq. 2, ``sum(stage times) + (K - 1) * slowest
stage`` with ``K = B / (dp * U)``; a candidate is dropped if a stage's memory
(``memory.stage_memory_bytes``) exceeds ``HardwareSpec.device_memory_bytes``, or if ``B`` is not
divisible by ``dp * U``. Best = lowest Eq. 2 time (= highest throughput ``dp * K / T``); ties go to
fewer GPUs, then the lexicographically smallest (dp, encoder tp, cp, pp, llm tp, cp, pp).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from entrain.core.costs.costmodel import COMPONENTS, CostModel
from entrain.core.costs.memory import choose_recompute
from entrain.core.costs.sampler import (
    Item,
    SampleStats,
    encoder_share,
    has_costs,
    mean_layer_ms,
    proportional_allocation,
)
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig, num_microbatches
from entrain.core.ir.plan import ComponentLayout, Layout, StageSpec
from entrain.core.planning.partition import min_max_partition

__all__ = [
    "ComponentConfig",
    "StaticConfig",
    "evaluate_config",
    "check_ep",
    "dp_options",
    "ep_options",
    "gpus_of",
    "search_candidates",
    "search_config",
    "no_fit_message",
]


@dataclass(frozen=True, slots=True)
class ComponentConfig:
    name: str
    tp: int
    cp: int
    pp: int
    layer_names: tuple[str, ...]
    layer_ranges: tuple[tuple[int, int], ...]
    stage_ms: tuple[float, ...]
    """Forward + backward ms of the mean microbatch per stage (per-call constants included)."""
    stage_memory_bytes: tuple[float, ...]
    recompute: tuple[str, ...] = ()
    """Per stage: the cheapest ``costmodel.RECOMPUTE_MODES`` entry that fits (empty: all ``none``);
    ``stage_ms`` includes its recomputation time."""
    ep: int | None = None
    """Expert parallelism of a component with mixture-of-experts layers (None: a dense component);
    ``stage_ms`` and ``stage_memory_bytes`` price it (``CostModel.expert_ms``, experts sharded)."""

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp

    def stage_recompute(self, j: int) -> str:
        return self.recompute[j] if self.recompute else "none"

    def to_json(self) -> dict:
        return {
            "tp": self.tp,
            "cp": self.cp,
            "pp": self.pp,
            "layer_names": list(self.layer_names),
            "layers_per_stage": [list(r) for r in self.layer_ranges],
            "stage_time_ms": list(self.stage_ms),
            "stage_memory_bytes": list(self.stage_memory_bytes),
            "recompute": [self.stage_recompute(j) for j in range(len(self.layer_ranges))],
            **({"ep": self.ep} if self.ep is not None else {}),
        }


@dataclass(frozen=True, slots=True)
class StaticConfig:
    """One evaluated static configuration (Algorithm 2's candidate or choice)."""

    dp: int
    microbatch_size: int
    num_microbatches: int
    gpus_per_replica: int
    allocation: tuple[int, int]
    """ProportionalAllocation's (encoder, LLM) GPU budgets M_i."""
    encoder: ComponentConfig
    llm: ComponentConfig
    predicted_iteration_time_ms: float
    """Paper Eq. 2: ``sum(stage times) + (K - 1) * slowest stage``."""
    memory_ok: bool
    device_memory_bytes: float

    @property
    def global_batch(self) -> int:
        return self.dp * self.microbatch_size * self.num_microbatches

    @property
    def components(self) -> dict[str, ComponentConfig]:
        return {"encoder": self.encoder, "llm": self.llm}

    @property
    def throughput_microbatches_per_ms(self) -> float:
        return self.dp * self.num_microbatches / self.predicted_iteration_time_ms

    @property
    def gpus_used_per_replica(self) -> int:
        return self.encoder.gpus + self.llm.gpus

    def sort_key(self) -> tuple:
        e, m = self.encoder, self.llm
        return (
            self.predicted_iteration_time_ms,
            self.gpus_used_per_replica * self.dp,
            self.dp,
            e.tp,
            e.cp,
            e.pp,
            m.tp,
            m.cp,
            m.pp,
            m.ep or 1,
        )

    def to_layout(self) -> Layout:
        """Disjoint encoder-then-LLM stages, one stage per pipeline rank."""
        stages, s = [], 0
        for comp in (self.encoder, self.llm):
            for j, (first, end) in enumerate(comp.layer_ranges):
                stages.append(StageSpec(s, comp.name, first, end, s, comp.stage_recompute(j)))
                s += 1
        return Layout(
            dp=self.dp,
            microbatch_size=self.microbatch_size,
            num_microbatches=self.num_microbatches,
            components={
                c.name: ComponentLayout(c.tp, c.cp, c.pp, c.ep or 1) for c in (self.encoder, self.llm)
            },
            stages=tuple(stages),
        )

    def to_json(self) -> dict:
        """The ``config`` object of ``entrain plan --json`` (docs/contract.md) plus extra keys."""
        return {
            "dp": self.dp,
            "microbatch_size": self.microbatch_size,
            "num_microbatches": self.num_microbatches,
            "gpus_per_replica": self.gpus_per_replica,
            "allocation": list(self.allocation),
            "components": {"encoder": self.encoder.to_json(), "llm": self.llm.to_json()},
            "memory_ok": self.memory_ok,
        }


def evaluate_config(
    profile: Sequence[Item] | SampleStats,
    cost: CostModel,
    parallel: ParallelConfig,
    *,
    encoder: tuple[int, int, int],
    llm: tuple[int, int, int],
    gpus_per_replica: int | None = None,
    allocation: tuple[int, int] | None = None,
) -> StaticConfig:
    """Evaluate one configuration: ``parallel``'s DP (None: 1), expert parallelism (``ep``, None: 1) and
    batch sizes, ``encoder`` / ``llm`` = (tp, cp, pp); min-max partition per component, Eq. 2 time and
    the memory check. ConfigError if a component has fewer layers than stages (``ParallelConfig``
    checked the batch's divisibility), or ``ep`` cannot shard this model (``check_ep``)."""
    stats = profile if isinstance(profile, SampleStats) else SampleStats.of(profile)
    if len(stats) == 0:
        raise ConfigError("the profile has no samples")
    dp, u, k = parallel.dp_or_1, parallel.microbatch_size, parallel.num_microbatches
    check_ep(cost, parallel.ep_or_1, dp, llm[0])
    limit = cost.hardware.device_memory_bytes
    degrees = {"encoder": encoder, "llm": llm}
    num_stages = encoder[2] + llm[2]
    comps, first = {}, 0
    for comp in COMPONENTS:
        tp, cp, pp = degrees[comp]
        if not has_costs(cost, comp, tp, cp):
            raise ConfigError(f"the cost model has no {comp} costs for tp={tp} cp={cp}")
        layer_ms = mean_layer_ms(stats, cost, comp, tp, cp, u)
        experts = cost.has_experts(comp)
        ep = parallel.ep_or_1 if experts else 1
        tokens = u * stats.column_summary(comp)[0] if experts and stats.has_tokens else 0.0
        if experts:  # the mean microbatch's busiest-rank expert tokens and all-to-all, per layer
            layer_ms = layer_ms + np.array(
                [
                    sum(cost.expert_ms(comp, i, tokens, p, tp, cp, ep) for p in ("fwd", "bwd"))
                    for i in range(len(layer_ms))
                ]
            )
        part = min_max_partition(layer_ms.tolist(), pp, cost.forbidden_cuts(comp))
        chosen = [
            choose_recompute(stats, cost, comp, f, e, tp, cp, u, num_stages - (first + j), limit, ep)
            for j, (f, e) in enumerate(part.ranges)
        ]
        stage_ms = tuple(t + c[2] for t, c in zip(part.stage_ms, chosen))
        if experts:  # a fully recomputed backward re-runs the experts' forward extra too
            stage_ms = tuple(
                t
                + cost.stage_expert_ms(comp, f, e, tokens, "bwd", tp, cp, ep, c[0])
                - cost.stage_expert_ms(comp, f, e, tokens, "bwd", tp, cp, ep)
                for t, (f, e), c in zip(stage_ms, part.ranges, chosen)
            )
        comps[comp] = ComponentConfig(
            comp, tp, cp, pp, tuple(cost.component(comp).layer_names), part.ranges,
            stage_ms, tuple(c[1] for c in chosen), tuple(c[0] for c in chosen), ep if experts else None,
        )  # fmt: skip
        first += pp
    stage_ms = comps["encoder"].stage_ms + comps["llm"].stage_ms
    t_iter = sum(stage_ms) + (k - 1) * max(stage_ms)
    mem_ok = all(m <= limit for c in comps.values() for m in c.stage_memory_bytes)
    g = gpus_per_replica if gpus_per_replica is not None else comps["encoder"].gpus + comps["llm"].gpus
    alloc = allocation if allocation is not None else (comps["encoder"].gpus, comps["llm"].gpus)
    return StaticConfig(dp, u, k, g, alloc, comps["encoder"], comps["llm"], t_iter, mem_ok, limit)


def check_ep(cost: CostModel, ep: int, dp: int, llm_tp: int) -> None:
    """ConfigError unless ``ep`` (expert parallelism) can shard ``cost``'s model at DP ``dp``: 1 always;
    more only on a model with experts, dividing ``dp`` and the experts, without tensor parallelism on
    the LLM (what the runtime's own check refuses too)."""
    if ep == 1:
        return
    experts = cost.num_experts("llm")
    if experts is None:
        raise ConfigError(f"--ep {ep} shards mixture-of-experts layers; {cost.model} has none: use --ep 1")
    if dp % ep or experts % ep:
        raise ConfigError(
            f"--ep {ep} must divide the data-parallel degree ({dp}) and the number of experts ({experts}): "
            "each expert lives on one rank of every group of ep replicas"
        )
    if llm_tp > 1:
        raise ConfigError(f"--ep {ep} does not compose with tensor parallelism (tp {llm_tp}) yet")


def ep_options(cost: CostModel, dp: int, ep: int | None) -> list[int]:
    """The expert-parallel degrees a search tries at DP ``dp``: ``ep`` when given (none where it does not
    divide ``dp``); on a model with experts every degree dividing both ``dp`` and the experts; 1 on a
    dense model."""
    experts = cost.num_experts("llm")
    if ep is not None:
        return [ep] if ep == 1 or (dp % ep == 0 and experts is not None and experts % ep == 0) else []
    if experts is None:
        return [1]
    return [e for e in range(1, dp + 1) if dp % e == 0 and experts % e == 0]


def _component_options(cost: CostModel, comp: str, budget: int, tp: int | None, cp: int | None):
    tps = [tp] if tp is not None else [1, 2, 4, 8]
    cps = [cp] if cp is not None else [1, 2]
    n_layers = cost.component(comp).num_layers
    out = []
    for t in tps:
        for c in cps:
            if not has_costs(cost, comp, t, c):
                continue
            # floor and ceil of the budget; more stages than layers is clamped to one layer a stage
            for pp in sorted({min(budget // (t * c), n_layers), min(-(-budget // (t * c)), n_layers)}):
                if pp >= 1 and (t, c, pp) not in out:
                    out.append((t, c, pp))
    return out


def dp_options(gpus: int, dp: int | None, global_batch: int, microbatch_size: int) -> list[int]:
    if dp is not None:
        if dp < 1 or gpus % dp:
            raise ConfigError(f"--gpus {gpus} is not divisible by --dp {dp}")
        if gpus // dp < 2:
            raise ConfigError(f"--gpus {gpus} / --dp {dp} leaves fewer than 2 GPUs per replica")
        num_microbatches(global_batch, dp, microbatch_size)
        return [dp]
    out = [d for d in range(1, gpus // 2 + 1) if gpus % d == 0 and global_batch % (d * microbatch_size) == 0]
    if not out:
        raise ConfigError(
            f"no DP degree divides both --gpus {gpus} (>= 2 GPUs per replica) and the global batch "
            f"{global_batch} / microbatch size {microbatch_size}"
        )
    return out


def search_candidates(
    profile: Sequence[Item] | SampleStats,
    cost: CostModel,
    parallel: ParallelConfig,
    *,
    allocation: tuple[int, int] | None = None,
) -> list[StaticConfig]:
    """Every candidate Algorithm 2 visits on ``parallel.gpus`` (feasible or not), best first
    (``StaticConfig.sort_key``, infeasible ones last). ``parallel.dp`` None tries every DP degree;
    ``tp``/``cp`` None searches {1, 2, 4, 8} / {1, 2} per component. ``allocation`` = the (encoder,
    LLM) GPU budgets per replica instead of ProportionalAllocation's."""
    stats = profile if isinstance(profile, SampleStats) else SampleStats.of(profile)
    share = encoder_share(stats, cost)
    gpus, tp, cp = gpus_of(parallel), parallel.tp, parallel.cp
    if parallel.ep_or_1 > 1:  # a dense model, tensor parallelism, a given DP it does not divide
        check_ep(cost, parallel.ep, parallel.dp or parallel.ep, tp or 1)
    out = []
    for d in dp_options(gpus, parallel.dp, parallel.global_batch, parallel.microbatch_size):
        g, at_d = gpus // d, replace(parallel, dp=d)
        m_enc, m_llm = allocation if allocation is not None else proportional_allocation(g, share)
        for e in _component_options(cost, "encoder", m_enc, tp, cp):
            for m in _component_options(cost, "llm", m_llm, tp, cp):
                if e[0] * e[1] * e[2] + m[0] * m[1] * m[2] > g:
                    continue
                for ep in ep_options(cost, d, parallel.ep):
                    if ep > 1 and m[0] > 1:
                        continue  # expert parallelism does not compose with tensor parallelism
                    out.append(
                        evaluate_config(
                            stats, cost, replace(at_d, ep=None if ep == 1 and parallel.ep is None else ep),
                            encoder=e, llm=m, gpus_per_replica=g, allocation=(m_enc, m_llm),
                        )
                    )  # fmt: skip
    out.sort(key=lambda c: (not c.memory_ok, c.sort_key()))
    return out


def gpus_of(parallel: ParallelConfig) -> int:
    """The GPU count a search plans for (ConfigError when ``parallel`` leaves it open)."""
    if parallel.gpus is None:
        raise ConfigError("the configuration search needs the GPU count (--gpus)")
    return parallel.gpus


def search_config(
    profile: Sequence[Item] | SampleStats, cost: CostModel, parallel: ParallelConfig
) -> StaticConfig:
    """Algorithm 2: the best feasible static configuration for the profile batch."""
    cands = search_candidates(profile, cost, parallel)
    if not cands:
        raise ConfigError(
            f"no configuration fits: --gpus {parallel.gpus}, --dp {parallel.dp}, --tp {parallel.tp} leave no "
            "TP x CP x PP factorisation within each component's GPU budget"
        )
    best = cands[0]
    if (
        not best.memory_ok
        and parallel.cp == 1
        and any(has_costs(cost, "encoder", t, 2) for t in (1, 2, 4, 8))
    ):
        # context parallelism where a single sample's patches overflow a stage even with recomputation
        wider = search_candidates(profile, cost, replace(parallel, cp=None))
        if wider and wider[0].memory_ok:
            return wider[0]
    if not best.memory_ok:
        stats = profile if isinstance(profile, SampleStats) else SampleStats.of(profile)
        raise ConfigError(no_fit_message(best, stats, gpus=gpus_of(parallel)))
    return best


def no_fit_message(best: StaticConfig, stats: SampleStats, *, gpus: int) -> str:
    """One line: what the best candidate needs, the largest sample of the component that overflows,
    and what would make it fit (GPUs, ``--max-pixels``, a smaller microbatch; recomputation is
    already at its strongest where needed)."""
    limit = best.device_memory_bytes
    comp = max(best.components.values(), key=lambda c: max(c.stage_memory_bytes))
    worst = max(comp.stage_memory_bytes)
    j = comp.stage_memory_bytes.index(worst)
    f, e = comp.layer_ranges[j]
    head = (
        f"no configuration fits in device memory ({limit / 1e9:.1f} GB): the best candidate's {comp.name} stage "
        f"{j} (layers [{f}, {e}), tp {comp.tp} cp {comp.cp}, recompute {comp.stage_recompute(j)}) needs "
        f"{worst / 1e9:.1f} GB"
    )
    if not stats.has_tokens:
        return f"{head}; use more GPUs (--gpus {2 * gpus}) or a smaller --microbatch-size"
    x1 = stats.enc_x1 if comp.name == "encoder" else stats.llm_x1
    k = int(np.argmax(x1))
    unit = "ViT patches" if comp.name == "encoder" else "LLM tokens"
    need = worst / limit
    pixels = ""
    if comp.name == "encoder":
        pixels = (
            f", --max-pixels about {int(x1[k] * 196 / max(need, 1.0) / 784) * 784} (a smaller largest image)"
        )
    return (
        f"{head}; the largest sample is {stats.ids[k]!r} ({int(x1[k])} {unit}); to fit: about {need:.1f}x the "
        f"GPUs per replica (--gpus {int(2 ** math.ceil(math.log2(max(need, 1.0) * 1.0001)) * gpus)}), "
        f"--microbatch-size 1{pixels}; recomputation is already full on that stage"
    )
