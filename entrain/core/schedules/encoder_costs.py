"""Action prices of a Plan with several encoders (``Layout.multi_encoder``): each encoder's stages by
its own cost model and sequence units, the LLM's by the first trainable encoder's cost model (the first
encoder's when none trains; its ``llm`` is the shared LLM, and it says whether the LLM's first stage
computes input gradients, as ``planning.encoders.search_encoders`` prices it).

``EncodersPlanCosts`` answers what the simulator and the metrics ask ``PlanCosts`` (compute, message
and activation prices per global stage, the model state and the all-reduce per pipeline rank) by
handing each stage to a one-encoder ``PlanCosts`` over that encoder's stages and the LLM's: its view of
the layout (``encoder_view``), the encoder's cost model with the encoder's units
(``planning.encoders.Encoder.units``: a vision tower counts images and frames, an audio tower its
clips' chunks), and each sample's work on that encoder (``SampleWork.encoders[i]`` for a raw-work
sample).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from entrain.core.costs.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.ir.plan import ActionKind, Layout, StageSpec
from entrain.core.schedules.action_costs import PlanCosts, StageQuad, step_end_time_ms
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork

__all__ = ["EncodersPlanCosts", "encoder_view"]


class _EncoderUnits:
    """``cost`` whose ``encoder`` component counts ``units`` of a sample (every other member is
    ``cost``'s)."""

    def __init__(self, cost: CostModel, units: Callable[[SampleMeta], tuple[int, ...]]):
        self._cost, self._units = cost, units

    def units(self, component: str, sample: SampleMeta) -> tuple[int, ...]:
        return tuple(self._units(sample)) if component == "encoder" else self._cost.units(component, sample)

    def __getattr__(self, name: str):
        return getattr(self._cost, name)


def encoder_view(layout: Layout, name: str) -> tuple[Layout, dict[int, int]]:
    """The one-encoder layout of encoder ``name``'s stages and the LLM's (renumbered from 0, its
    degrees under the ``encoder`` key) and the map from a global stage to its stage there."""
    if name not in layout.encoder_names:
        raise ConfigError(f"layout has no encoder {name!r} (encoders: {list(layout.encoder_names)})")
    mine = [s for s in layout.stages if s.encoder == name] + [
        s for s in layout.stages if s.component == "llm"
    ]
    where = {s.stage: i for i, s in enumerate(mine)}
    stages = tuple(replace(s, stage=i, encoder=None) for i, s in enumerate(mine))
    comps = {"encoder": layout.components[name]}
    if "llm" in layout.components:
        comps["llm"] = layout.components["llm"]
    return Layout(layout.dp, layout.microbatch_size, layout.num_microbatches, comps, stages), where


def _samples_of(samples: dict[str, SampleWork], index: int) -> dict[str, SampleWork]:
    out = {}
    for sid, w in samples.items():
        if w.meta is None and not w.encoders:
            raise ConfigError(
                f"sample {sid!r}: a plan with several encoders needs each encoder's work (SampleWork.encoders) "
                "or token metadata"
            )
        enc = w.encoders[index] if w.encoders else w.encoder
        out[sid] = SampleWork(sid, enc, w.llm, w.meta)
    return out


class EncodersPlanCosts:
    """Prices the actions of Plans over a multi-encoder ``layout``; ``encoders``: one per encoder name
    of the layout, each with ``name``, ``cost`` (a ``CostModel`` whose ``encoder`` is that encoder's
    layers) and ``units`` (``planning.encoders.Encoder``), in the layout's encoder order."""

    def __init__(self, layout: Layout, encoders: Sequence, samples: dict[str, SampleWork]):
        names = [e.name for e in encoders]
        if not layout.multi_encoder or tuple(names) != layout.encoder_names:
            raise ConfigError(
                f"encoders {names} do not match the layout's encoder pipelines {list(layout.encoder_names)}"
            )
        self.layout = layout
        self.samples = samples
        self.cost = encoders[0].cost
        self._subs: list[PlanCosts] = []
        self._of: dict[int, tuple[PlanCosts, int]] = {}
        trains = [any(x.trainable for x in e.cost.encoder.layers) for e in encoders]
        llm_from = trains.index(True) if any(trains) else 0  # the LLM sends gradients on if any trains
        for i, enc in enumerate(encoders):
            view, where = encoder_view(layout, enc.name)
            sub = PlanCosts(view, _EncoderUnits(enc.cost, enc.units), _samples_of(samples, i))  # type: ignore[arg-type]
            self._subs.append(sub)
            for g, local in where.items():
                if layout.stages[g].component == "encoder" or i == llm_from:
                    self._of[g] = (sub, local)
        n = len(layout.stages)
        self.stage_quads: tuple[StageQuad, ...] = tuple(
            self._at(s)[0].stage_quads[self._at(s)[1]] for s in range(n)
        )
        self.expert_stages = tuple(self._at(s)[0].expert_stages[self._at(s)[1]] for s in range(n))
        if any(self.expert_stages):
            raise ConfigError("a plan with several encoders and mixture-of-experts layers is not priced yet")
        self.tabled = tuple(self._at(s)[0].tabled[self._at(s)[1]] for s in range(n))
        self.label_stages = tuple(self._at(s)[0].label_stages[self._at(s)[1]] for s in range(n))

    def _at(self, stage: int) -> tuple[PlanCosts, int]:
        return self._of[stage]

    def stage_spec(self, stage: int) -> StageSpec:
        return self.layout.stages[stage]

    # --- per-stage prices, each from its encoder's costs ------------------------------------------------
    def compute_ms(self, stage: int, kind: ActionKind, ids: Iterable[str]) -> float:
        sub, local = self._at(stage)
        return sub.compute_ms(local, kind, ids)

    def tokens(self, stage: int, ids: Iterable[str]) -> float:
        sub, local = self._at(stage)
        return sub.tokens(local, ids)

    def activation_bytes(self, stage: int, ids: Iterable[str]) -> float:
        sub, local = self._at(stage)
        return sub.activation_bytes(local, ids)

    def recompute_transient_bytes(self, stage: int, ids: Iterable[str]) -> float:
        sub, local = self._at(stage)
        return sub.recompute_transient_bytes(local, ids)

    def message_bytes(self, src_stage: int, ids: Iterable[str]) -> float:
        sub, local = self._at(src_stage)
        return sub.message_bytes(local, ids)

    def part_bytes(self, src_stage: int, ids: tuple[str, ...]) -> dict[str, float]:
        sub, local = self._at(src_stage)
        return sub.part_bytes(local, ids)

    def message_ms(self, src_stage: int, ids: tuple[str, ...]) -> float:
        sub, local = self._at(src_stage)
        return sub.message_ms(local, ids)

    def p2p_ms(self, num_bytes: float) -> float:
        return self._subs[0].p2p_ms(num_bytes)

    # --- per pipeline rank -----------------------------------------------------------------------------
    def model_state_bytes(self, pp_rank: int) -> float:
        return sum(
            q.state_bytes for s, q in zip(self.layout.stages, self.stage_quads) if s.pp_rank == pp_rank
        )

    def allreduce_ms(self, pp_rank: int) -> float:
        """DP gradient all-reduce of one pipeline rank's stages, as ``PlanCosts.allreduce_ms`` (no experts)."""
        dp = self.layout.dp
        num_bytes = sum(
            q.grad_bytes for s, q in zip(self.layout.stages, self.stage_quads) if s.pp_rank == pp_rank
        )
        if dp <= 1 or num_bytes <= 0:
            return 0.0
        hw = self.cost.hardware
        return hw.allreduce_latency_ms + 2.0 * (dp - 1) / dp * num_bytes / hw.allreduce_bandwidth_bytes_per_ms

    def step_end_ms(self) -> float:
        """The end-of-step phase, as ``PlanCosts.step_end_ms`` (the first encoder's hardware)."""
        return step_end_time_ms(self.layout, self.stage_quads, self.cost.hardware)
