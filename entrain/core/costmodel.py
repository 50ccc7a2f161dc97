"""Per-layer cost model: ``T(x) = a*x^2 + b*x + c`` per layer, phase and TP/CP degree.

One schema serves the analytic presets (``entrain.core.presets``) and measured profiles
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
import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from entrain.core.errors import ConfigError
from entrain.core.layer_specs import MessagePart
from entrain.core.samples import LABEL_FRACTION, SampleMeta
from entrain.core.work import SampleWork

if TYPE_CHECKING:
    from entrain.core.plan import Layout

__all__ = [
    "Quadratic",
    "LayerCost",
    "ComponentCost",
    "HardwareSpec",
    "CostModel",
    "parallel_key",
    "COMPONENTS",
    "RECOMPUTE_MODES",
    "PROFILE_SOURCE",
    "precision_mismatch",
]

Component = Literal["encoder", "llm"]
Phase = Literal["fwd", "bwd", "bwd_split", "bwd_input"]
"""``bwd``: the backward in one call (``B``); ``bwd_split``: the backward split into ``I`` and ``W``
(``bwd`` plus the split's own cost, ``LayerCost.split_extra_fraction`` and ``split_extra_ms``);
``bwd_input``: the input-gradient part of ``bwd_split`` (what ``I`` runs; the rest is ``W``)."""
COMPONENTS: tuple[Component, ...] = ("encoder", "llm")
Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[Recompute, ...] = ("none", "selective", "full")
"""Activation recomputation of a stage, cheapest first (docs/design.md §4; ``docs/cost_model.md``):

* ``none``: every layer keeps what its backward needs (``activation_bytes_per_token`` and the squared
  term).
* ``selective``: each layer's attention sub-block is recomputed in the backward (Megatron's
  selective recomputation, widened to the sub-block so the runtime can checkpoint a module): the
  layer drops ``selective_bytes_per_token`` and its squared (score) term, and its backward first
  re-runs the forward's score term plus ``selective_fwd_fraction`` of its linear term.
* ``full``: each layer keeps only its input (the previous layer's ``output_bytes_per_token``; a
  component's first layer keeps its own activations) and re-runs its whole forward in the backward.
  While a layer is recomputed its full activations exist for that one (sub-)microbatch:
  ``CostModel.recompute_transient_bytes``."""
SCHEMA_VERSION = 1
PROFILE_SOURCE = "entrain profile"
"""``notes["source"]`` of a measured profile."""
MAX_TABLE_POWER = 2.0
"""Largest growth power a table extends beyond its last point (attention is quadratic per unit)."""
SMALL_CALL_EXPONENT = 0.5
"""``CostModel.small_call_factor``: a call of a quarter of the efficient size costs 2x per token."""


def parallel_key(tp: int, cp: int) -> str:
    """Key of a TP/CP degree in a layer's cost tables, e.g. ``"tp2cp1"``."""
    return f"tp{tp}cp{cp}"


def _first(point: tuple[float, float]) -> float:
    return point[0]


@dataclass(frozen=True, slots=True)
class Quadratic:
    """``a*x^2 + b*x + c`` milliseconds for ``x`` tokens of one sequence unit.

    Optional ``table``: measured ``(x, ms)`` points of a monotone curve (``entrain profile`` writes one
    where the quadratic fits its measurements badly). When present it replaces ``a, b, c`` (kept as
    the least-squares fit, for reference): between two points ``T(x)`` follows the power law through
    them (``ms ~ x^k``, linear on log-log axes: exact for a pure power, where a straight line
    overshoots a convex cost: ``x^2`` sampled at 1024 and 4096 tokens, read at 2048, is 50 % too high
    on the line; ``x^2 / 10^4 + x`` 8.5 % on the line, 3.5 % on the power law);
    beyond the last point the last segment's power, at most ``MAX_TABLE_POWER``; below the first
    point linearly from ``(0, constant_ms)``. ``constant_ms`` (the per-call part) is the first
    segment extrapolated linearly to ``x = 0``, clamped to ``[0, first ms]``.
    """

    a: float = 0.0
    b: float = 0.0
    c: float = 0.0
    table: tuple[tuple[float, float], ...] = ()
    """``(x, ms)`` points, ``x`` strictly increasing, ``ms`` non-decreasing; empty: the quadratic."""

    def __post_init__(self) -> None:
        xs = [x for x, _ in self.table]
        ms = [y for _, y in self.table]
        if self.table and (
            xs[0] <= 0
            or ms[0] < 0
            or any(b <= a for a, b in zip(xs, xs[1:]))
            or any(b < a for a, b in zip(ms, ms[1:]))
        ):
            raise ConfigError(
                f"cost table {list(self.table)}: x must be positive and increasing, ms non-negative and non-decreasing"
            )

    @property
    def constant_ms(self) -> float:
        """The per-call constant (``c``, or the table's value at ``x = 0``)."""
        if not self.table:
            return self.c
        (x0, y0) = self.table[0]
        if len(self.table) == 1:
            return y0
        (x1, y1) = self.table[1]
        return min(y0, max(0.0, y0 - (y1 - y0) / (x1 - x0) * x0))

    def variable_ms(self, x: float) -> float:
        """The size-dependent part ``a*x^2 + b*x`` (no per-call constant)."""
        if self.table:
            return self._table_ms(x) - self.constant_ms
        return self.a * x * x + self.b * x

    def _table_ms(self, x: float) -> float:
        pts = self.table
        if len(pts) == 1:
            return pts[0][1] * (x / pts[0][0] if x < pts[0][0] else 1.0)
        if x <= pts[0][0]:
            c = self.constant_ms
            return c + (pts[0][1] - c) * max(0.0, x) / pts[0][0]
        i = min(bisect_right(pts, x, key=_first), len(pts) - 1)
        (xa, ya), (xb, yb) = pts[i - 1], pts[i]
        if ya <= 0.0 or yb <= ya:
            return ya + (yb - ya) * (x - xa) / (xb - xa)
        power = math.log(yb / ya) / math.log(xb / xa)
        if x > xb:
            return yb * (x / xb) ** min(power, MAX_TABLE_POWER)
        return ya * (x / xa) ** power

    def __call__(self, x: float) -> float:
        return self.variable_ms(x) + self.constant_ms

    def scaled(self, factor: float) -> Quadratic:
        """Every time multiplied by ``factor`` (coefficients and table alike)."""
        table = tuple((x, ms * factor) for x, ms in self.table)
        return Quadratic(self.a * factor, self.b * factor, self.c * factor, table)

    def to_json(self) -> dict:
        out = {"a": self.a, "b": self.b, "c": self.c}
        if self.table:
            out["table"] = [[x, ms] for x, ms in self.table]
        return out

    @classmethod
    def from_json(cls, d: dict) -> Quadratic:
        table = tuple((float(x), float(ms)) for x, ms in d.get("table", ()))
        return cls(float(d.get("a", 0.0)), float(d.get("b", 0.0)), float(d.get("c", 0.0)), table)


@dataclass(frozen=True, slots=True)
class LayerCost:
    """One layer (patch embedding, a ViT block, the merger, token embedding, a decoder layer,
    final norm, lm_head, loss) of one component."""

    name: str
    kind: str
    fwd: dict[str, Quadratic]
    """Forward time per TP/CP key (``parallel_key``)."""
    bwd: dict[str, Quadratic]
    """Full backward time (input + weight gradients) per TP/CP key."""
    activation_bytes_per_token: float = 0.0
    """Bytes held for backward per input token at TP=CP=1 (Megatron's formula, bf16)."""
    activation_bytes_per_token_sq: float = 0.0
    """Bytes held for backward per squared sequence-unit length at TP=CP=1: materialised attention
    scores (eager attention); 0 with flash attention."""
    output_bytes_per_token: float = 0.0
    """Bytes of this layer's output per token: what crosses a stage boundary after it."""
    param_bytes: float = 0.0
    trainable: bool = True
    bwd_input_fraction: float = 0.5
    """Share of ``bwd`` spent on input gradients (what a frozen layer still runs)."""
    selective_bytes_per_token: float = 0.0
    """Bytes per token (TP=CP=1) of ``activation_bytes_per_token`` that selective recomputation drops:
    the attention sub-block's saved tensors beyond its input."""
    selective_fwd_fraction: float = 0.0
    """Share of the forward's linear term that selective recomputation re-runs (the attention
    sub-block's projections); its squared term is re-run whole."""
    split_extra_fraction: float = 0.0
    """Extra share of ``bwd`` a backward split into ``I`` and ``W`` costs (the runtime's weight-gradient
    pass walks the layer's graph a second time: ``torch.distributed.pipelining``'s
    ``stage_backward_weight``); 0 in the GPU presets, measured on the CPU (``benchmarks/fit_cpu_tiny.py``)."""
    split_extra_ms: float = 0.0
    """The split's extra per-call constant (ms per call of this layer)."""
    per_label: bool = False
    """``x`` counts label tokens (the layer runs only where the loss is taken: ``lm_head``, loss), not
    the sequence's tokens. False in cost files written before the distinction (their head layers
    were priced per LLM token at ``LABEL_FRACTION``)."""

    kv_param_bytes: float = 0.0
    """Of ``param_bytes``: a decoder layer's K/V projections (``rank_param_bytes``)."""
    kv_heads: int = 0
    """A decoder layer's KV heads (0: not one)."""
    message_parts: tuple[MessagePart, ...] = ()
    """The parts besides the hidden states a stage boundary after this layer carries
    (``LayerSpec.message_parts``)."""
    no_cut_after: bool = False
    """No stage may end after this layer (``LayerSpec.no_cut_after``)."""

    def keys(self) -> list[str]:
        return sorted(self.fwd)

    def rank_param_bytes(self, tp: int) -> float:
        """``param_bytes`` one of ``tp`` TP ranks holds: a ``1/tp`` shard, but the K/V projections
        whole when ``tp`` exceeds the KV heads (replicated on every rank, as the runtime does)."""
        if tp == 1 or not self.kv_heads or self.kv_heads % tp == 0:
            return self.param_bytes / tp
        return (self.param_bytes - self.kv_param_bytes) / tp + self.kv_param_bytes

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "fwd": {k: q.to_json() for k, q in self.fwd.items()},
            "bwd": {k: q.to_json() for k, q in self.bwd.items()},
            "activation_bytes_per_token": self.activation_bytes_per_token,
            "activation_bytes_per_token_sq": self.activation_bytes_per_token_sq,
            "output_bytes_per_token": self.output_bytes_per_token,
            "param_bytes": self.param_bytes,
            "trainable": self.trainable,
            "bwd_input_fraction": self.bwd_input_fraction,
            "selective_bytes_per_token": self.selective_bytes_per_token,
            "selective_fwd_fraction": self.selective_fwd_fraction,
            "per_label": self.per_label,
            **({"kv_param_bytes": self.kv_param_bytes, "kv_heads": self.kv_heads} if self.kv_heads else {}),
            **(
                {"split_extra_fraction": self.split_extra_fraction, "split_extra_ms": self.split_extra_ms}
                if self.split_extra_fraction or self.split_extra_ms
                else {}
            ),
            **({"message_parts": [p.to_json() for p in self.message_parts]} if self.message_parts else {}),
            **({"no_cut_after": True} if self.no_cut_after else {}),
        }

    @classmethod
    def from_json(cls, d: dict) -> LayerCost:
        return cls(
            name=d["name"],
            kind=d["kind"],
            fwd={k: Quadratic.from_json(v) for k, v in d["fwd"].items()},
            bwd={k: Quadratic.from_json(v) for k, v in d["bwd"].items()},
            activation_bytes_per_token=float(d.get("activation_bytes_per_token", 0.0)),
            activation_bytes_per_token_sq=float(d.get("activation_bytes_per_token_sq", 0.0)),
            output_bytes_per_token=float(d.get("output_bytes_per_token", 0.0)),
            param_bytes=float(d.get("param_bytes", 0.0)),
            trainable=bool(d.get("trainable", True)),
            bwd_input_fraction=float(d.get("bwd_input_fraction", 0.5)),
            selective_bytes_per_token=float(d.get("selective_bytes_per_token", 0.0)),
            selective_fwd_fraction=float(d.get("selective_fwd_fraction", 0.0)),
            per_label=bool(d.get("per_label", False)),
            kv_param_bytes=float(d.get("kv_param_bytes", 0.0)),
            kv_heads=int(d.get("kv_heads", 0)),
            split_extra_fraction=float(d.get("split_extra_fraction", 0.0)),
            split_extra_ms=float(d.get("split_extra_ms", 0.0)),
            message_parts=tuple(MessagePart.from_json(p) for p in d.get("message_parts", ())),
            no_cut_after=bool(d.get("no_cut_after", False)),
        )


def _split(q: Quadratic, layer: LayerCost) -> Quadratic:
    """A trainable layer's backward run as ``I`` + ``W``: ``q`` and the split's extra cost."""
    if not (layer.split_extra_fraction or layer.split_extra_ms):
        return q
    q = q.scaled(1.0 + layer.split_extra_fraction)
    extra = layer.split_extra_ms
    table = tuple((x, ms + extra) for x, ms in q.table)
    return Quadratic(q.a, q.b, q.c + extra, table)


@dataclass(frozen=True, slots=True)
class ComponentCost:
    """The ordered layer list of one component (``encoder`` or ``llm``)."""

    name: Component
    layers: tuple[LayerCost, ...]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def needs_input_grad(self, layer_idx: int) -> bool:
        """True if some layer before ``layer_idx`` (or the component before it) trains, so the
        gradient must flow through this layer. The LLM always passes gradients to the encoder
        side when any encoder layer trains; the caller decides that via ``upstream_trainable``."""
        return any(layer.trainable for layer in self.layers[:layer_idx])

    def to_json(self) -> dict:
        return {"name": self.name, "layers": [layer.to_json() for layer in self.layers]}

    @classmethod
    def from_json(cls, d: dict) -> ComponentCost:
        return cls(name=d["name"], layers=tuple(LayerCost.from_json(x) for x in d["layers"]))


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """Device and interconnect facts the simulator and the memory check use."""

    name: str
    device_memory_bytes: float = 48e9
    p2p_bandwidth_bytes_per_ms: float = 25e6
    """25e6 B/ms = 25 GB/s."""
    p2p_latency_ms: float = 0.01
    allreduce_bandwidth_bytes_per_ms: float = 12.5e6
    allreduce_latency_ms: float = 0.05
    encoder_min_efficient_tokens: float = 0.0
    """A call (one (sub-)microbatch on a stage) of fewer ViT patches runs below full efficiency
    (``CostModel.small_call_factor``); 0: no loss."""
    llm_min_efficient_tokens: float = 0.0
    """Likewise for LLM tokens."""
    action_overhead_ms: float = 0.0
    """What a rank pays per compute action (``F``, ``B``, ``I`` or ``W``) outside the stage's layers,
    however many layers the stage holds: the executor's dispatch, posting the stage-boundary send, a
    receive's own copy. 0 in the GPU presets (the host runs ahead), ``cpu-tiny``'s fitted on traced runs;
    ``entrain profile --from-trace`` measures it on the run's ranks (docs/profiling.md)."""

    def to_json(self) -> dict:
        extra = {"action_overhead_ms": self.action_overhead_ms} if self.action_overhead_ms else {}
        return {
            "name": self.name,
            "device_memory_bytes": self.device_memory_bytes,
            "p2p_bandwidth_bytes_per_ms": self.p2p_bandwidth_bytes_per_ms,
            "p2p_latency_ms": self.p2p_latency_ms,
            "allreduce_bandwidth_bytes_per_ms": self.allreduce_bandwidth_bytes_per_ms,
            "allreduce_latency_ms": self.allreduce_latency_ms,
            "encoder_min_efficient_tokens": self.encoder_min_efficient_tokens,
            "llm_min_efficient_tokens": self.llm_min_efficient_tokens,
            **extra,
        }

    @classmethod
    def from_json(cls, d: dict) -> HardwareSpec:
        return cls(**{k: (v if k == "name" else float(v)) for k, v in d.items()})


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
    @staticmethod
    def units(component: Component, sample: SampleMeta) -> tuple[int, ...]:
        """The sequence units a sample contributes: per-image ViT patches, or one LLM sequence."""
        if component == "encoder":
            return sample.vit_patches_per_image
        return (sample.llm_tokens,)

    @staticmethod
    def labels(component: Component, sample: SampleMeta) -> tuple[float, ...] | None:
        """The label tokens per sequence unit (what ``per_label`` layers run on); None on the encoder."""
        return None if component == "encoder" else (sample.label_tokens,)

    @staticmethod
    def _layer_units(layer: LayerCost, units: Iterable[int], labels: Iterable[float] | None):
        if not layer.per_label:
            return units
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
        units = self._layer_units(layer, units, labels)
        key = parallel_key(tp, cp)
        if key not in layer.fwd:
            raise KeyError(f"{self.model}/{component}/{layer.name}: no cost for {key}; have {layer.keys()}")
        if phase == "fwd":
            q = layer.fwd[key]
        else:
            q = self._bwd_quadratic(comp, layer_idx, key)
            if q is not None and phase != "bwd" and layer.trainable:
                q = _split(q, layer)
                if phase == "bwd_input":
                    q = q.scaled(layer.bwd_input_fraction)  # a frozen layer's backward is input-only already
        if q is None:
            return 0.0
        return sum(q.variable_ms(x) for x in units) + q.constant_ms * num_calls

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
