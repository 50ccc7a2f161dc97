"""Plans for a run: layout from stage counts (min-max layer partition under the cost model), then the
system's batcher and schedule generator per iteration (as the simulator plans). No torch."""

from __future__ import annotations

from collections.abc import Sequence

from entrain.core.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.partition import min_max_partition
from entrain.core.plan import ComponentLayout, Layout, Plan, StageSpec
from entrain.core.systems import plan_system
from entrain.core.work import SampleWork

__all__ = ["runtime_layout", "make_plan"]


def _layer_ms(cost: CostModel, component: str, probe: Sequence[SampleWork]) -> list[float]:
    metas = [w.meta for w in probe if w.meta is not None]
    comp = cost.component(component)
    out = []
    for i in range(comp.num_layers):
        units = [u for m in metas for u in cost.units(component, m)]
        out.append(sum(cost.layer_ms(component, i, units, ph) for ph in ("fwd", "bwd")))
    return out


def runtime_layout(
    cost: CostModel,
    *,
    encoder_stages: int,
    llm_stages: int,
    dp: int,
    microbatch_size: int,
    num_microbatches: int,
    probe: Sequence[SampleWork],
    colocated: bool = False,
) -> Layout:
    """Stages split by the min-max layer partition of each component over the ``probe`` samples' work.
    ``colocated``: rank r holds encoder chunk r and LLM chunk r (needs equal stage counts)."""
    if encoder_stages < 1 or llm_stages < 1:
        raise ConfigError(f"need at least one encoder and one LLM stage, got {encoder_stages} + {llm_stages}")
    if colocated and encoder_stages != llm_stages:
        raise ConfigError(
            f"colocated (DIP) layouts need equal stage counts, got {encoder_stages} + {llm_stages}"
        )
    stages: list[StageSpec] = []
    for comp, n in (("encoder", encoder_stages), ("llm", llm_stages)):
        layer_ms = _layer_ms(cost, comp, probe)
        if n > len(layer_ms):
            raise ConfigError(f"{n} {comp} stages but the {comp} has only {len(layer_ms)} layers")
        for k, (first, end) in enumerate(min_max_partition(layer_ms, n).ranges):
            pp = k if colocated or comp == "encoder" else encoder_stages + k
            stages.append(StageSpec(len(stages), comp, first, end, pp))
    comps = {"encoder": ComponentLayout(pp=encoder_stages), "llm": ComponentLayout(pp=llm_stages)}
    return Layout(
        dp=dp,
        microbatch_size=microbatch_size,
        num_microbatches=num_microbatches,
        components=comps,
        stages=tuple(stages),
    )


def make_plan(
    system: str,
    layout: Layout,
    batches: Sequence[Sequence[SampleWork]],
    cost: CostModel,
    options: dict | None = None,
) -> Plan:
    """One iteration per global batch in ``batches``, by ``system``'s batcher and generator: the same
    Plans the simulator runs (``entrain.core.systems.plan_system``)."""
    return plan_system(system, layout, batches, cost, options)
