"""The parts a cost model is built from: a fitted time curve (``Quadratic``), one layer's curves and
sizes (``LayerCost``), a component's ordered layers (``ComponentCost``) and the device and interconnect
facts (``HardwareSpec``); ``entrain.core.costs.costmodel`` puts them together and says how ``x`` is counted.
Units: milliseconds, bytes, tokens.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Literal

from entrain.core.errors import ConfigError
from entrain.core.model.layer_specs import MessagePart

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
MAX_TABLE_POWER = 2.0
"""Largest growth power a table extends beyond its last point (attention is quadratic per unit)."""


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


def uniform_router_imbalance(tokens: float, num_experts: int, top_k: int) -> float:
    """Expected busiest-expert tokens over the mean when ``tokens`` tokens each pick ``top_k`` of
    ``num_experts`` experts uniformly: an expert's count is Binomial(``tokens``, ``k/E``), and the largest
    of ``E`` such counts is about ``mean + z_E * std`` with ``z_E`` the expected largest of ``E``
    standard normals (Blom's ``Phi^-1((E - 0.375) / (E + 0.25))``; 2.58 for 128 experts), so
    ``1 + z_E * sqrt((1 - k/E) * E / (tokens * k))``, at least ``ceil(mean) / mean`` (whole tokens)
    and at most ``E / k`` (every token on the same experts); 1 when every expert is picked (``k = E``) or no token is routed. Within 2 % of sampled
    uniform routing for 8-128 experts (``tests/core/test_moe_costs.py``)."""
    e, k = num_experts, top_k
    if tokens <= 0 or k >= e:
        return 1.0
    z = NormalDist().inv_cdf((e - 0.375) / (e + 0.25))
    f = 1.0 + z * math.sqrt((1.0 - k / e) * e / (tokens * k))
    mean = tokens * k / e
    return min(max(f, math.ceil(mean) / mean), e / k)  # the busiest expert holds at least ceil(mean)


@dataclass(frozen=True, slots=True)
class ExpertTiming:
    """A mixture-of-experts block measured on a machine (``entrain profile``: transformers' router and
    experts modules of the checkpoint's config, random weights, at several token counts and per-expert
    loads; docs/profiling.md, "Mixture-of-experts layers"). Per phase (forward, full backward): the
    experts' time ``call_ms * experts that get a token + slot_ms * routed (token, expert) slots`` (plus a
    constant, not kept), and the router's time per token."""

    fwd_slot_ms: float
    bwd_slot_ms: float
    fwd_call_ms: float = 0.0
    bwd_call_ms: float = 0.0
    router_fwd_ms_per_token: float = 0.0
    router_bwd_ms_per_token: float = 0.0

    def slot_ms(self, phase: str) -> float:
        """ms per routed slot of ``fwd`` or of the full backward (any other phase)."""
        return self.fwd_slot_ms if phase == "fwd" else self.bwd_slot_ms

    def to_json(self) -> dict:
        return {
            "fwd": {"slot_ms": self.fwd_slot_ms, "call_ms": self.fwd_call_ms,
                    "router_ms_per_token": self.router_fwd_ms_per_token},
            "bwd": {"slot_ms": self.bwd_slot_ms, "call_ms": self.bwd_call_ms,
                    "router_ms_per_token": self.router_bwd_ms_per_token},
        }  # fmt: skip

    @classmethod
    def from_json(cls, d: dict) -> ExpertTiming:
        f, b = d["fwd"], d["bwd"]
        return cls(
            float(f["slot_ms"]),
            float(b["slot_ms"]),
            float(f.get("call_ms", 0.0)),
            float(b.get("call_ms", 0.0)),
            float(f.get("router_ms_per_token", 0.0)),
            float(b.get("router_ms_per_token", 0.0)),
        )


@dataclass(frozen=True, slots=True)
class ExpertCost:
    """The experts of a mixture-of-experts layer (``LayerCost.experts``; docs/design.md,
    "Mixture-of-experts costs"). The layer's curves price the router, attention and the ``top_k``
    experts per token at a balanced load on one rank holding every expert; ``fraction`` of their
    linear (per-token) term is the experts' work, which a rank of an expert-parallel group runs for the
    tokens routed to its ``num_experts / ep`` experts. ``a2a_bytes_per_token``: what one token's
    dispatch and combine move (``2 * top_k * hidden * 2`` bytes, bf16) before the ``(ep - 1) / ep``
    that leaves the rank; ``param_bytes``: the experts' share of the layer's ``param_bytes`` (sharded
    over ``ep``); ``skew``: the busiest expert's load over a uniform router's (1: uniform; refitted
    from a run's ``expert_tokens`` by ``entrain profile --from-trace``); ``measured``: the experts timed
    by ``entrain profile`` (``ExpertTiming``), which then price an expert token instead of ``fraction``
    of the layer's linear term (``CostModel.expert_ms``)."""

    num_experts: int
    top_k: int
    fraction: float
    a2a_bytes_per_token: float
    param_bytes: float
    skew: float = 1.0
    measured: ExpertTiming | None = None

    def busiest_expert_factor(self, group_tokens: float) -> float:
        """Busiest expert's tokens over the mean when the EP group routes ``group_tokens`` tokens."""
        f = self.skew * uniform_router_imbalance(group_tokens, self.num_experts, self.top_k)
        return min(f, self.num_experts / self.top_k)

    def rank_load_factor(self, tokens: float, ep: int) -> float:
        """Expert tokens of the busiest rank of an ``ep``-rank group, each rank routing ``tokens``, over
        ``tokens * top_k`` (a balanced rank's): the rank holding the busiest expert (factor ``f``), its
        other ``g - 1`` of ``g = E / ep`` experts at the mean of the rest:
        ``(f + (g - 1) (E - f) / (E - 1)) / g``; 1 at ``ep = 1`` (one rank runs every expert), ``f`` at
        ``ep = E``."""
        e = self.num_experts
        if ep <= 1 or e <= 1:
            return 1.0
        f = self.busiest_expert_factor(tokens * ep)
        g = e / ep
        return (f + (g - 1.0) * (e - f) / (e - 1.0)) / g

    def to_json(self) -> dict:
        return {
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "fraction": self.fraction,
            "a2a_bytes_per_token": self.a2a_bytes_per_token,
            "param_bytes": self.param_bytes,
            "skew": self.skew,
            **({"measured": self.measured.to_json()} if self.measured is not None else {}),
        }

    @classmethod
    def from_json(cls, d: dict) -> ExpertCost:
        return cls(
            int(d["num_experts"]),
            int(d["top_k"]),
            float(d["fraction"]),
            float(d["a2a_bytes_per_token"]),
            float(d["param_bytes"]),
            float(d.get("skew", 1.0)),
            ExpertTiming.from_json(d["measured"]) if d.get("measured") else None,
        )


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
    experts: ExpertCost | None = None
    """A mixture-of-experts layer's experts (``ExpertCost``); None: a dense layer."""
    audio: tuple[LayerCost, ...] = ()
    """An audio tower run in this layer's call on the sample's audio rows (``CostModel.units``
    ``EncoderUnits``): the Omni thinker's, on the first encoder layer, where the runtime runs it and its
    parameters sit (``param_bytes`` already holds them). Its layers are priced over the audio rows only,
    this layer over the vision rows; empty (every other layer and model): all of the sample's units.
    Only the first layer of a component may carry one (``CostModel.units`` looks there)."""

    def keys(self) -> list[str]:
        return sorted(self.fwd)

    def rank_param_bytes(self, tp: int, ep: int = 1) -> float:
        """``param_bytes`` one of ``tp`` TP ranks holds: a ``1/tp`` shard, but the K/V projections
        whole when ``tp`` exceeds the KV heads (replicated on every rank, as the runtime does); with
        ``ep`` > 1 a mixture-of-experts layer's experts are ``1/ep`` of them."""
        if ep > 1 and self.experts is not None:
            sharded = self.experts.param_bytes * (1.0 - 1.0 / ep) / tp
            return replace(self, experts=None).rank_param_bytes(tp) - sharded
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
            **({"experts": self.experts.to_json()} if self.experts is not None else {}),
            **({"audio": [x.to_json() for x in self.audio]} if self.audio else {}),
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
            experts=ExpertCost.from_json(d["experts"]) if d.get("experts") else None,
            audio=tuple(LayerCost.from_json(x) for x in d.get("audio", ())),
        )


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
    step_end_ms: float = 0.0
    """What a step spends outside its actions, once per iteration: the end-of-step phase (waiting for
    the last sends, the loss and gradient-norm all-reduces, clipping, the optimizer step; at expert
    parallelism the step's action check and routing statistics) and the start's label count, less the
    DP gradient all-reduce the simulator prices on its own (``allreduce_*``). 0 in the presets (the
    A40 presets are calibrated on whole iteration times, or not measured); ``entrain profile
    --from-trace`` fits it from the runs' iteration times against their traced spans."""
    step_end_ms_per_param_byte: float = 0.0
    """Of the end-of-step phase, the per-parameter part (clipping and the optimizer update): ms per
    trainable parameter byte (bf16, ``LayerCost.rank_param_bytes``) of the pipeline rank holding the
    most (``PlanCosts.step_end_ms``). 0 in the presets; fitted where the traced runs' layouts differ."""

    def to_json(self) -> dict:
        extra = {"action_overhead_ms": self.action_overhead_ms} if self.action_overhead_ms else {}
        for key in ("step_end_ms", "step_end_ms_per_param_byte"):
            if getattr(self, key):
                extra[key] = getattr(self, key)
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
