"""Per-layer cost model: ``T(x) = a*x^2 + b*x + c`` per layer, phase and TP/CP degree.

One schema serves the analytic presets (``entrain.core.costs.presets``) and measured profiles
(``entrain profile``). Units: milliseconds, bytes, tokens.

How ``x`` is counted: a layer is evaluated once per *sequence unit* (an image for the encoder:
its ViT patches; a sample for the LLM: its tokens) and the quadratic term is per unit because
attention never crosses units (per-image attention in the ViT, per-sample causal masks in packed
LLM microbatches). A layer that runs only at the label positions (``LayerCost.per_label``: the
``lm_head`` and the loss, which the runtime evaluates where the loss is taken) is evaluated on a
sample's label tokens instead (``SampleMeta.label_tokens``: its answer tokens where the data says,
``LABEL_FRACTION`` of its LLM tokens where it does not). The constant ``c`` is paid once per call,
i.e. once per (sub-)microbatch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from entrain.core.costs.layer_costs import (
    COMPONENTS,
    RECOMPUTE_MODES,
    Component,
    ComponentCost,
    ExpertCost,
    ExpertTiming,
    HardwareSpec,
    LayerCost,
    Phase,
    Quadratic,
    Recompute,
    parallel_key,
)
from entrain.core.errors import ConfigError
from entrain.core.model.layer_specs import MessagePart
from entrain.core.workload.samples import LABEL_FRACTION, SampleMeta
from entrain.core.workload.work import SampleWork

if TYPE_CHECKING:
    from entrain.core.ir.plan import Layout

__all__ = [
    "Quadratic",
    "LayerCost",
    "ComponentCost",
    "ExpertCost",
    "ExpertTiming",
    "HardwareSpec",
    "CostModel",
    "EncoderUnits",
    "parallel_key",
    "COMPONENTS",
    "RECOMPUTE_MODES",
    "PROFILE_SOURCE",
    "precision_mismatch",
]

SCHEMA_VERSION = 1
PROFILE_SOURCE = "entrain profile"
"""``notes["source"]`` of a measured profile."""
SMALL_CALL_EXPONENT = 0.5
"""``CostModel.small_call_factor``: a call of a quarter of the efficient size costs 2x per token."""


def _split(q: Quadratic, layer: LayerCost) -> Quadratic:
    """A trainable layer's backward run as ``I`` + ``W``: ``q`` and the split's extra cost."""
    if not (layer.split_extra_fraction or layer.split_extra_ms):
        return q
    q = q.scaled(1.0 + layer.split_extra_fraction)
    extra = layer.split_extra_ms
    table = tuple((x, ms + extra) for x, ms in q.table)
    return Quadratic(q.a, q.b, q.c + extra, table)


class EncoderUnits(tuple):
    """A sample's encoder units (``SampleMeta.encoder_units``: its vision rows, then its audio chunks'
    rows) where the encoder's first layer runs an audio tower (``LayerCost.audio``): ``vision`` and
    ``audio`` split them, each priced by its own tower's layers (``CostModel.layer_ms``); sums and
    activation memory see all of them, as before."""

    vision: tuple[int, ...]
    audio: tuple[int, ...]

    @classmethod
    def of(cls, units: Sequence[int], num_audio: int) -> EncoderUnits:
        out = cls(units)
        cut = len(units) - num_audio
        out.vision, out.audio = tuple(units[:cut]), tuple(units[cut:])
        return out


def _audio_ms(layer: LayerCost, units: Iterable[int], phase: Phase, key: str) -> float:
    """``phase`` of the audio tower ``layer`` runs (``LayerCost.audio``) over the audio rows of ``units``
    (an ``EncoderUnits``; none in plain units), per-call constants excluded. The tower is the first
    thing on its way, so a frozen layer of it runs no backward."""
    rows = units.audio if isinstance(units, EncoderUnits) else ()
    total = 0.0
    for a in layer.audio if rows else ():
        if key not in a.fwd:
            raise KeyError(f"{layer.name}/{a.name}: no cost for {key}; have {a.keys()}")
        if phase == "fwd":
            q = a.fwd[key]
        elif not a.trainable:
            continue
        else:
            q = a.bwd[key] if phase == "bwd" else _split(a.bwd[key], a)
            if phase == "bwd_input":
                q = q.scaled(a.bwd_input_fraction)
        total += sum(q.variable_ms(x) for x in rows)
    return total


@dataclass(frozen=True, slots=True)
class CostModel:
    """Per-layer costs of both components on one hardware, plus the token rule they use."""

    model: str
    hardware: HardwareSpec
    encoder: ComponentCost
    llm: ComponentCost
    notes: dict = field(default_factory=dict, compare=False)
    """Free-form provenance (preset fit residuals, profile device, ...)."""

    def measured_precision(self) -> tuple[str, bool] | None:
        """``(precision, recorded)`` of a measured profile: the precision (``fp32`` / ``bf16``) its layers
        were timed in, ``recorded`` False for a file written before profiles recorded it (timed in
        fp32 then); None for a cost model that was not measured (an analytic preset)."""
        if self.notes.get("source") != PROFILE_SOURCE:
            return None
        if "precision" in self.notes:
            return str(self.notes["precision"]), True
        return "fp32", False

    def component(self, name: Component) -> ComponentCost:
        if name == "encoder":
            return self.encoder
        if name == "llm":
            return self.llm
        raise ValueError(f"unknown component {name!r}; expected one of {COMPONENTS}")

    def small_call_factor(self, component: Component, tokens: float) -> float:
        """Multiplier on the size-dependent time of one call of ``tokens`` tokens: 1 at or above the
        hardware's ``*_min_efficient_tokens`` ``n``, ``(n / tokens) ** SMALL_CALL_EXPONENT`` below it
        (a kernel on a small input fills the device partly; docs/cost_model.md)."""
        hw = self.hardware
        n = hw.encoder_min_efficient_tokens if component == "encoder" else hw.llm_min_efficient_tokens
        if n <= 0 or tokens >= n or tokens <= 0:
            return 1.0
        return (n / tokens) ** SMALL_CALL_EXPONENT

    # --- sequence units -------------------------------------------------------------------------
    def units(self, component: Component, sample: SampleMeta) -> tuple[int, ...]:
        """The sequence units a sample contributes: per-image ViT patches (and audio chunks,
        ``SampleMeta.encoder_units``), or one LLM sequence. Where the encoder's first layer runs an
        audio tower (``LayerCost.audio``) and the sample has audio, an ``EncoderUnits``: the same units,
        knowing which are the audio tower's rows."""
        if component == "encoder":
            units = sample.encoder_units
            if sample.audio and self.audio_tower:
                return EncoderUnits.of(units, len(sample.audio_units))
            return units
        return (sample.llm_tokens,)

    @property
    def audio_tower(self) -> bool:
        """Whether the encoder's first layer runs an audio tower (``LayerCost.audio``): then a sample's
        audio rows (``SampleMeta.audio_units``) are that tower's, priced by its own layers, here
        (``units``) and in the planner's column statistics (``sampler.SampleStats``); else they are
        rows of the encoder's layers."""
        layers = self.encoder.layers
        return bool(layers and layers[0].audio)

    @staticmethod
    def labels(component: Component, sample: SampleMeta) -> tuple[float, ...] | None:
        """The label tokens per sequence unit (what ``per_label`` layers run on); None on the encoder."""
        return None if component == "encoder" else (sample.label_tokens,)

    @staticmethod
    def _layer_units(layer: LayerCost, units: Iterable[int], labels: Iterable[float] | None):
        if not layer.per_label:
            return units.vision if isinstance(units, EncoderUnits) else units
        return labels if labels is not None else [LABEL_FRACTION * x for x in units]

    # --- layer and stage times ------------------------------------------------------------------
    def layer_ms(
        self,
        component: Component,
        layer_idx: int,
        units: Iterable[int],
        phase: Phase,
        tp: int = 1,
        cp: int = 1,
        num_calls: int = 1,
        labels: Iterable[float] | None = None,
    ) -> float:
        """Time of one layer over ``units`` (all in ``num_calls`` calls; 0 calls = no constant);
        a ``per_label`` layer runs on ``labels`` (per unit; None: ``LABEL_FRACTION`` of each unit)."""
        comp = self.component(component)
        layer = comp.layers[layer_idx]
        heard = _audio_ms(layer, units, phase, parallel_key(tp, cp)) if layer.audio else None
        units = self._layer_units(layer, units, labels)
        q = self._phase_quadratic(comp, layer_idx, parallel_key(tp, cp), phase)
        if q is None:
            return 0.0 if heard is None else heard
        ms = sum(q.variable_ms(x) for x in units) + q.constant_ms * num_calls
        return ms if heard is None else ms + heard

    def _phase_quadratic(
        self, comp: ComponentCost, layer_idx: int, key: str, phase: Phase
    ) -> Quadratic | None:
        """The curve ``layer_ms`` prices ``phase`` of a layer with (None: the layer runs no backward)."""
        layer = comp.layers[layer_idx]
        if key not in layer.fwd:
            raise KeyError(f"{self.model}/{comp.name}/{layer.name}: no cost for {key}; have {layer.keys()}")
        if phase == "fwd":
            return layer.fwd[key]
        q = self._bwd_quadratic(comp, layer_idx, key)
        if q is not None and phase != "bwd" and layer.trainable:
            q = _split(q, layer)
            if phase == "bwd_input":
                q = q.scaled(layer.bwd_input_fraction)  # a frozen layer's backward is input-only already
        return q

    # --- mixture-of-experts layers (docs/design.md, "Mixture-of-experts costs") ---------------------
    def has_experts(self, component: Component) -> bool:
        """Whether a layer of ``component`` is a mixture of experts."""
        return any(layer.experts is not None for layer in self.component(component).layers)

    def num_experts(self, component: Component) -> int | None:
        """The experts of ``component``'s sparse layers (the most of any; None: a dense component)."""
        counts = [x.experts.num_experts for x in self.component(component).layers if x.experts is not None]
        return max(counts) if counts else None

    def expert_ms(
        self,
        component: Component,
        layer_idx: int,
        tokens: float,
        phase: Phase,
        tp: int = 1,
        cp: int = 1,
        ep: int = 1,
        recompute: Recompute = "none",
    ) -> float:
        """What one call of ``tokens`` tokens on a rank of an ``ep``-rank expert-parallel group costs a
        mixture-of-experts layer beyond ``layer_ms`` (which prices a balanced router on one rank holding
        every expert): the busiest rank's extra expert tokens (``ExpertCost.rank_load_factor``) at the
        experts' share of the phase's linear time, and with ``ep`` > 1 the all-to-all (dispatch and
        combine: ``tokens * a2a_bytes_per_token * (ep - 1) / ep`` bytes on the data-parallel link, once
        forward and once in the input-gradient backward; a weight-gradient ``W`` moves nothing). A
        backward under ``full`` recomputation re-runs the forward's. 0 for a dense layer."""
        comp = self.component(component)
        x = comp.layers[layer_idx].experts
        if x is None or tokens <= 0:
            return 0.0
        q = self._phase_quadratic(comp, layer_idx, parallel_key(tp, cp), phase)
        if q is None:
            return 0.0
        per_token = self._expert_token_ms(comp, layer_idx, parallel_key(tp, cp), q, phase)
        total = per_token * tokens * (x.rank_load_factor(tokens, ep) - 1.0)
        if ep > 1:
            hw = self.hardware
            total += hw.allreduce_latency_ms + x.a2a_bytes_per_token * tokens * (ep - 1) / ep / (
                hw.allreduce_bandwidth_bytes_per_ms
            )
        if phase != "fwd" and recompute == "full" and layer_idx > 0:
            total += self.expert_ms(component, layer_idx, tokens, "fwd", tp, cp, ep)
        return total

    def _expert_token_ms(
        self, comp: ComponentCost, layer_idx: int, key: str, q: Quadratic, phase: Phase
    ) -> float:
        """The experts' ms per token (its ``top_k`` slots) of ``phase`` (curve ``q``) at a balanced load:
        the measured slot time (``ExpertCost.measured``, ``entrain profile``) times ``top_k`` — a backward
        phase's share of it as ``q``'s linear term is of the layer's full backward's — else ``fraction``
        of ``q``'s linear term (the preset's FLOP share)."""
        layer = comp.layers[layer_idx]
        x = layer.experts
        m = x.measured
        if m is None:
            return x.fraction * q.b
        per_token = x.top_k * m.slot_ms(phase)
        if phase == "fwd":
            return per_token
        full = layer.bwd[key].b
        return per_token * (q.b / full if full > 0 else 1.0)

    def stage_expert_ms(
        self,
        component: Component,
        first: int,
        end: int,
        tokens: float,
        phase: Phase,
        tp: int = 1,
        cp: int = 1,
        ep: int = 1,
        recompute: Recompute = "none",
    ) -> float:
        """``expert_ms`` summed over layers ``[first, end)``."""
        return sum(
            self.expert_ms(component, i, tokens, phase, tp, cp, ep, recompute) for i in range(first, end)
        )

    def _bwd_quadratic(self, comp: ComponentCost, layer_idx: int, key: str) -> Quadratic | None:
        layer = comp.layers[layer_idx]
        q = layer.bwd[key]
        if layer.trainable:
            return q
        # A frozen layer computes input gradients only if something before it trains.
        if not self.input_grad_needed(comp.name, layer_idx):
            return None
        return q.scaled(layer.bwd_input_fraction)

    def input_grad_needed(self, component: Component, layer_idx: int) -> bool:
        """Whether the gradient must flow into layer ``layer_idx``'s input: some layer before it in
        the encoder-then-LLM chain trains (the LLM passes gradients to a trainable encoder, which
        the encoder's own layer list cannot see)."""
        if self.component(component).needs_input_grad(layer_idx):
            return True
        return component == "llm" and any(x.trainable for x in self.encoder.layers)

    def stage_ms(
        self,
        component: Component,
        first: int,
        end: int,
        units: Sequence[int],
        phase: Phase,
        tp: int = 1,
        cp: int = 1,
        num_calls: int = 1,
        labels: Sequence[float] | None = None,
    ) -> float:
        """Time of layers ``[first, end)`` over ``units`` (label tokens ``labels``) in ``num_calls`` calls."""
        return sum(
            self.layer_ms(component, i, units, phase, tp, cp, num_calls, labels) for i in range(first, end)
        )

    def sample_work(self, sample: SampleMeta, tp: int = 1, cp: int = 1) -> SampleWork:
        """Forward + backward ms of the whole of each component for one sample, constants excluded."""
        enc_units = self.units("encoder", sample)
        llm_units, llm_labels = self.units("llm", sample), self.labels("llm", sample)
        n_enc, n_llm = self.encoder.num_layers, self.llm.num_layers
        enc = sum(
            self.stage_ms("encoder", 0, n_enc, enc_units, p, tp, cp, num_calls=0) for p in ("fwd", "bwd")
        )
        llm = sum(
            self.stage_ms("llm", 0, n_llm, llm_units, p, tp, cp, num_calls=0, labels=llm_labels)
            for p in ("fwd", "bwd")
        )
        return SampleWork(sample.id, enc, llm, sample)

    def per_call_ms(self, component: Component, tp: int = 1, cp: int = 1) -> float:
        """Forward + backward per-call constants of a whole component (one microbatch call)."""
        n = self.component(component).num_layers
        return sum(self.stage_ms(component, 0, n, (), p, tp, cp, num_calls=1) for p in ("fwd", "bwd"))

    def activation_bytes(
        self,
        component: Component,
        first: int,
        end: int,
        tokens: float,
        tp: int = 1,
        cp: int = 1,
        tokens_sq: float = 0.0,
    ) -> float:
        """Bytes layers ``[first, end)`` keep for backward over ``tokens`` tokens whose sequence
        units' squared lengths sum to ``tokens_sq`` (only eager attention has a squared term)."""
        layers = self.component(component).layers[first:end]
        per_token = sum(layer.activation_bytes_per_token for layer in layers)
        per_sq = sum(layer.activation_bytes_per_token_sq for layer in layers)
        return (tokens * per_token + tokens_sq * per_sq) / (tp * cp)

    def kept_bytes_per_token(
        self, component: Component, first: int, end: int, recompute: Recompute = "none"
    ) -> tuple[float, float]:
        """(bytes per token, bytes per squared unit length) that layers ``[first, end)`` keep for
        their backward under ``recompute``, at TP = CP = 1 (divide by ``tp * cp``). Layers that run
        no backward keep nothing."""
        if recompute not in RECOMPUTE_MODES:
            raise ConfigError(f"recompute {recompute!r}; choose from {', '.join(RECOMPUTE_MODES)}")
        layers = self.component(component).layers
        lin = sq = 0.0
        for i in range(first, end):
            if self._bwd_quadratic(self.component(component), i, parallel_key(1, 1)) is None:
                continue
            layer = layers[i]
            if recompute == "none":
                lin += layer.activation_bytes_per_token
                sq += layer.activation_bytes_per_token_sq
            elif recompute == "selective":
                lin += max(0.0, layer.activation_bytes_per_token - layer.selective_bytes_per_token)
            elif i == 0:
                lin += layer.activation_bytes_per_token
                sq += layer.activation_bytes_per_token_sq
            else:
                lin += layers[i - 1].output_bytes_per_token
        return lin, sq

    def recompute_transient_bytes(
        self,
        component: Component,
        first: int,
        end: int,
        recompute: Recompute,
        tokens: float,
        tokens_sq: float,
    ) -> float:
        """Bytes (TP = CP = 1) that exist only while a backward of ``tokens`` tokens re-runs one layer's
        forward: the largest recomputed layer's dropped activations (0 without recomputation)."""
        coefs = self.recompute_dropped_bytes_per_token(component, first, end, recompute)
        return max([0.0, *(lin * tokens + sq * tokens_sq for lin, sq in coefs)])

    def recompute_dropped_bytes_per_token(
        self, component: Component, first: int, end: int, recompute: Recompute
    ) -> tuple[tuple[float, float], ...]:
        """Per layer of ``[first, end)``: (bytes per token, per squared unit length) that ``recompute``
        drops and its backward re-creates (TP = CP = 1); empty for ``none``."""
        if recompute == "none":
            return ()
        out = []
        for i in range(first, end):
            full = self.kept_bytes_per_token(component, i, i + 1, "none")
            kept = self.kept_bytes_per_token(component, i, i + 1, recompute)
            out.append((full[0] - kept[0], full[1] - kept[1]))
        return tuple(out)

    def recompute_ms(
        self,
        component: Component,
        layer_idx: int,
        units: Iterable[int],
        recompute: Recompute,
        tp: int = 1,
        cp: int = 1,
        num_calls: int = 1,
        labels: Iterable[float] | None = None,
    ) -> float:
        """Forward time layer ``layer_idx`` re-runs in its backward under ``recompute`` (0 for a
        layer without backward, and for ``none``)."""
        comp = self.component(component)
        units = self._layer_units(comp.layers[layer_idx], units, labels)
        key = parallel_key(tp, cp)
        if recompute == "none" or self._bwd_quadratic(comp, layer_idx, key) is None:
            return 0.0
        if recompute == "full" and layer_idx == 0:
            return 0.0  # a component's first layer keeps its activations (see kept_bytes_per_token)
        q = comp.layers[layer_idx].fwd[key]
        if recompute == "full":
            return sum(q.variable_ms(x) for x in units) + q.constant_ms * num_calls
        frac = comp.layers[layer_idx].selective_fwd_fraction
        if frac <= 0.0 and q.a == 0.0:
            return 0.0
        if q.table:
            return sum(frac * q.variable_ms(x) for x in units) + frac * q.constant_ms * num_calls
        return sum(q.a * x * x + frac * q.b * x for x in units) + frac * q.c * num_calls

    def boundary_bytes(
        self, component: Component, layer_idx: int, tokens: float, image_tokens: float = 0.0
    ) -> float:
        """Bytes sent after layer ``layer_idx`` (exclusive end of a stage) for ``tokens`` tokens with
        ``image_tokens`` image feature rows: the hidden states and every other message part."""
        hidden = tokens * self.component(component).layers[layer_idx - 1].output_bytes_per_token
        return hidden + sum(self.part_bytes(component, layer_idx, tokens, image_tokens).values())

    def boundary_parts(self, component: Component, layer_idx: int) -> tuple[MessagePart, ...]:
        """The parts besides the hidden states a stage ending at ``layer_idx`` (exclusive) sends (none past
        the component's last layer: the layout's own check names that error)."""
        layers = self.component(component).layers
        return layers[layer_idx - 1].message_parts if layer_idx <= len(layers) else ()

    def part_bytes(
        self, component: Component, layer_idx: int, tokens: float, image_tokens: float
    ) -> dict[str, float]:
        """Bytes of each part besides the hidden states sent after layer ``layer_idx``, by name."""
        return {p.name: p.bytes_for(tokens, image_tokens) for p in self.boundary_parts(component, layer_idx)}

    def forbidden_cuts(self, component: Component) -> frozenset[int]:
        """The cut points ``j`` (a stage ending at layer ``j``, exclusive) no partition may use."""
        layers = self.component(component).layers
        return frozenset(i + 1 for i, layer in enumerate(layers) if layer.no_cut_after)

    def layout_with_parts(self, layout: Layout) -> Layout:
        """``layout`` with every stage's ``parts`` (what its forward message carries besides the hidden
        states) from its last layer's ``message_parts``; the same layout when no layer declares any."""
        stages = tuple(
            dataclasses.replace(s, parts=self.boundary_parts(s.component, s.end_layer))
            if s.end_layer > 0
            else s
            for s in layout.stages
        )
        if stages == layout.stages:
            return layout
        return dataclasses.replace(layout, stages=stages)

    # --- serialisation ----------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "hardware": self.hardware.to_json(),
            "components": {"encoder": self.encoder.to_json(), "llm": self.llm.to_json()},
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, d: dict) -> CostModel:
        comps = d["components"]
        return cls(
            model=d["model"],
            hardware=HardwareSpec.from_json(d["hardware"]),
            encoder=ComponentCost.from_json(comps["encoder"]),
            llm=ComponentCost.from_json(comps["llm"]),
            notes=dict(d.get("notes", {})),
        )

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def load(cls, path: str, expect_model: str | None = None) -> CostModel:
        """Read a profile/cost-model JSON; with ``expect_model``, refuse one measured for another model.
        ConfigError (one line) for a missing, unreadable or malformed file."""
        from entrain.core.files import file_problem

        problem = file_problem(path)
        if problem is not None:
            raise ConfigError(f"profile {path}: {problem}")
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"profile {path}: not a JSON file ({e})") from None
        try:
            cost = cls.from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            what = f"missing key {e}" if isinstance(e, KeyError) else str(e) or type(e).__name__
            raise ConfigError(
                f"profile {path}: not an entrain profile or cost model ({what}); write one with `entrain profile`"
            ) from None
        if expect_model is not None and cost.model != expect_model:
            raise ConfigError(
                f"{path}: profile is for model {cost.model!r} but --model is {expect_model!r}; "
                f"pass --model {cost.model} or profile {expect_model} (entrain profile --model {expect_model})"
            )
        return cost


def precision_mismatch(path: str, cost: CostModel, run_precision: str, run: str) -> str | None:
    """One line when the measured profile at ``path`` was timed in another precision than ``run`` (the
    run, in words) computes in; None when they agree or ``cost`` was not measured."""
    measured = cost.measured_precision()
    if measured is None or measured[0] == run_precision:
        return None
    precision, recorded = measured
    timed = (
        f"was measured in {precision}"
        if recorded
        else f"records no precision (written before `entrain profile --precision`; taken as {precision})"
    )
    return (
        f"profile {path} {timed} but {run} computes in {run_precision}: its layer times are not this run's; "
        f"re-profile with `entrain profile --precision {run_precision}`"
    )
