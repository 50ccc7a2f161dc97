"""Analytic cost-model presets: ``build_cost_model(model, hardware)``.

Every model preset (``entrain.core.model.architectures.MODEL_PRESETS``) works with every hardware preset:

* ``a40-flops``: per-layer FLOPs / (A40 bf16 peak 149.7 TFLOP/s x one efficiency factor), memory-bound
  layers (embedding, norms, loss) at the A40's 696 GB/s x the same factor, TP/CP collectives on the
  A40 cluster's links, plus a per-call constant per layer (kernel launches).
* ``a40-paper``: the same model with per-component efficiency factors fitted so that Algorithm 1's
  ProportionalAllocation on b=256 draws reproduces the paper's b=256 GPU splits (Tables 2, 5-11).
  The fit is ``benchmarks/fit_a40_paper.py``; results in ``benchmarks/results/a40_paper_fit.md`` and
  ``docs/cost_model.md``.
* ``a40-fig4``: ``a40-flops`` with the LLM's efficiency and eager attention's score-traffic rate
  fitted to paper Fig. 4's per-sample ratios (``benchmarks/fit_a40_fig4.py``); priced with eager
  attention in the encoder unless ``attention`` says otherwise (Fig. 4's setup with the
  ``qwen25vl-fullatt-llama3-1b`` model).
* ``cpu-tiny``: FLOP-proportional layer costs scaled to the single-thread CPU measurements of the
  ``tiny`` model (``docs/design.md`` §6.9), with the measured ~7 ms forward + ~7 ms
  backward per-call constant per component split evenly over its layers.

Modelling choices (see ``docs/cost_model.md``):

* Sequence units: per image (ViT patches) for the encoder, per sample (text + merged image tokens)
  for the LLM; quadratic terms come from attention within a unit.
* ViT blocks: window attention over 112-px windows (64 patches) is linear in the patch count (each
  patch attends its window); the full-attention blocks (7, 15, 23, 31) are quadratic per image.
* LLM attention is causal (half the FLOPs of full attention).
* ``lm_head`` and ``loss`` run only at label positions: they are priced per label token
  (``LayerCost.per_label``), so a sample's answer length (``SampleMeta.label_tokens``: its answer
  tokens, or ``LABEL_FRACTION`` = 0.2 of its LLM tokens where the data does not say) sets their
  time. Their activation and message bytes stay per LLM token at ``LABEL_FRACTION``. An explicit
  ``label_fraction`` prices them per LLM token at that fraction instead, whatever the samples say.
* Backward = 2x forward FLOPs for matmuls (input + weight gradients, ``bwd_input_fraction`` 0.5),
  2.5x for attention scores (flash-attention recomputation).
* Activation bytes per token: Megatron's accounting (Korthikanti et al. 2022) in bf16 with flash
  attention (no s^2 term), no dropout, SwiGLU MLP: ``16h + 6i`` per ViT block and
  ``8h + 4*q_dim + 4*kv_dim + 6i`` per decoder layer (``h`` hidden, ``i`` intermediate).
* Parameter bytes are bf16 (2 per parameter); a tied lm_head adds none (its weight is the embedding's).
* TP: Megatron tensor parallelism (2 all-reduces of ``x*h*2`` bytes forward, 2 backward, per block);
  CP: each rank computes ``x/cp`` queries against all keys and gathers the other ranks' K/V.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from importlib import resources

from entrain.core.costs.costmodel import (
    ComponentCost,
    CostModel,
    HardwareSpec,
    LayerCost,
    Quadratic,
    parallel_key,
)
from entrain.core.costs.layer_costs import ExpertCost
from entrain.core.errors import ConfigError
from entrain.core.model.architectures import get_arch
from entrain.core.model.layer_specs import LayerSpec
from entrain.core.model.omni import EncoderSwapped, audio_tower_specs
from entrain.core.model.shape import ModelShape
from entrain.core.workload.samples import LABEL_FRACTION

__all__ = [
    "HARDWARE_PRESETS",
    "ATTENTION_IMPLS",
    "attention_by_component",
    "FREEZE_OPTIONS",
    "trainable_parts",
    "LABEL_FRACTION",
    "TP_DEGREES",
    "CP_DEGREES",
    "DeviceModel",
    "analytic_cpu_tiny",
    "build_cost_model",
    "cost_model_for",
    "default_hardware",
    "resolve_cost_model",
    "layer_specs",
]

TP_DEGREES = (1, 2, 4, 8)
CP_DEGREES = (1, 2)
HARDWARE_PRESETS = ("a40-flops", "a40-paper", "a40-fig4", "cpu-tiny")
FREEZE_OPTIONS = ("encoder", "vit", "llm")
"""``encoder``: the whole vision tower incl. merger; ``vit``: the tower without the merger (the merger
trains, computing only its own weight gradients); ``llm``: every LLM layer."""


def trainable_parts(freeze: Iterable[str]) -> tuple[str, ...]:
    """The parts that still train under ``freeze`` (``FREEZE_OPTIONS``): of ``vit`` (the tower without
    the merger), ``merger`` and ``llm``; empty: the run has nothing to learn."""
    freeze = set(freeze)
    parts = {
        "vit": not freeze & {"encoder", "vit"},
        "merger": "encoder" not in freeze,
        "llm": "llm" not in freeze,
    }
    return tuple(p for p, trains in parts.items() if trains)


BWD_MATMUL_FACTOR = 2.0
BWD_ATTENTION_FACTOR = 2.5
"""Flash attention's backward recomputes the scores: 2.5x the forward attention FLOPs."""

ATTENTION_IMPLS = ("flash", "eager")
DEFAULT_ATTENTION = {"a40-fig4": "encoder=eager,llm=flash"}
"""Attention implementation a hardware preset is priced with when none is given (others: flash)."""
"""``flash``: fused attention, scores never reach memory (the default, and what the runtime runs).
``eager``: transformers' ``eager_attention_forward`` (``Q K^T * scale (+ mask) -> softmax(fp32) ->
bf16 -> @ V``), which materialises every score; its traffic is priced at the preset's memory rate."""
EAGER_FWD_BYTES_PER_SCORE = 20.0
"""Forward memory traffic per score element per head, bf16 with an fp32 softmax: write QK^T (2),
scale (read 2 + write 2), softmax (read 2, write fp32 4), cast to bf16 (read 4 + write 2), read by
``@ V`` (2)."""
EAGER_MASK_BYTES_PER_SCORE = 6.0
"""Adding a causal mask (LLM): read scores and mask (2 + 2), write (2)."""
EAGER_BWD_BYTES_PER_SCORE = 36.0
"""Backward traffic per score per head: ``dP`` written (2) and ``P`` read for ``dV`` (2), cast back
(read 2, write fp32 4), softmax backward (read y and dy 4 + 4, write 4), cast to bf16 (read 4 + write
2), scale (read 2 + write 2), ``dS`` read for ``dQ`` and ``dK`` (2 + 2)."""
EAGER_SAVED_BYTES_PER_SCORE = 6.0
"""Bytes per score per head kept for backward: the fp32 softmax output (4) and its bf16 copy (2)."""
EAGER_BWD_ATTENTION_FACTOR = 2.0
"""Eager backward runs two score matmuls per forward one and recomputes nothing."""


def layer_specs(arch: ModelShape, label_fraction: float | None = None) -> dict[str, list[LayerSpec]]:
    """The hardware-independent layer lists of both components: any model family's ``ModelShape``
    gives them (``ModelShape.layer_specs``)."""
    if label_fraction is not None and not 0.0 < label_fraction <= 1.0:
        raise ConfigError(f"label_fraction must be in (0, 1], got {label_fraction}")
    return arch.layer_specs(label_fraction)


# --------------------------------------------------------------------------------------------------
# Device models: how work becomes milliseconds.
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DeviceModel:
    """Rates turning a ``LayerSpec`` into ``Quadratic`` costs, per component.

    ``lin_flops_per_ms`` / ``quad_flops_per_ms``: effective FLOP rates for the linear and the
    quadratic (attention-score) terms; ``bytes_per_ms``: memory traffic rate; ``fwd_call_ms`` /
    ``bwd_call_ms``: per-call constant of one whole component, spread evenly over its layers;
    ``collective_bytes_per_ms[degree]``: TP/CP link bandwidth; ``collective_latency_ms`` per collective."""

    spec: HardwareSpec
    lin_flops_per_ms: dict[str, float]
    quad_flops_per_ms: dict[str, float]
    bytes_per_ms: dict[str, float]
    fwd_call_ms: dict[str, float]
    bwd_call_ms: dict[str, float]
    collective_bytes_per_ms: dict[int, float]
    collective_latency_ms: float
    notes: dict
    score_bytes_per_ms: dict[str, float] | None = None
    """Memory rate of eager attention's score traffic per component; ``None``: ``bytes_per_ms``."""
    bwd_input_fraction: dict[str, float] | None = None
    """Measured share of a trainable layer's backward spent on input gradients, per layer kind;
    ``None`` or a kind left out: 0.5 (the matmuls' FLOPs split evenly)."""
    kind_scales: dict[str, dict[str, float]] | None = None
    """Measured corrections per fitted layer kind (``fitted_kind``; ``cpu-tiny``: ``benchmarks/fit_cpu_tiny.py``): ``fwd``,
    ``bwd`` scale the size-dependent part, ``fwd_const``, ``bwd_const`` the per-call constant, and
    ``split_extra_fraction``, ``split_extra_ms`` are the ``LayerCost`` fields; a kind left out: 1, 0."""


def attention_by_component(attention: str) -> dict[str, str]:
    """``"flash"`` / ``"eager"`` (both components) or ``"encoder=IMPL,llm=IMPL"`` -> ``{component: impl}``
    (a component left out keeps flash)."""
    if attention in ATTENTION_IMPLS:
        return {"encoder": attention, "llm": attention}
    out = {"encoder": "flash", "llm": "flash"}
    for part in attention.split(","):
        comp, sep, impl = part.strip().partition("=")
        if not sep or comp not in out or impl not in ATTENTION_IMPLS:
            raise ConfigError(
                f"attention {attention!r}: expected one of {', '.join(ATTENTION_IMPLS)} or "
                f"'encoder=IMPL,llm=IMPL' with IMPL in {', '.join(ATTENTION_IMPLS)}"
            )
        out[comp] = impl
    return out


def _eager_traffic(s: LayerSpec) -> tuple[float, float, float]:
    """Eager attention's score traffic of ``s`` per unit power of ``x`` (quadratic for full / causal
    scores, linear for window scores): forward bytes, backward bytes, bytes kept for backward."""
    if s.attention == "none":
        return 0.0, 0.0, 0.0
    per = s.heads * (s.window if s.attention == "window" else 1)
    mask = EAGER_MASK_BYTES_PER_SCORE if s.attention == "causal" else 0.0
    return (
        per * (EAGER_FWD_BYTES_PER_SCORE + mask),
        per * EAGER_BWD_BYTES_PER_SCORE,
        per * EAGER_SAVED_BYTES_PER_SCORE,
    )


def _quadratics(
    s: LayerSpec, dev: DeviceModel, num_layers: int, tp: int, cp: int, attention: str = "flash"
) -> tuple[Quadratic, Quadratic]:
    comp = s.component
    shard = tp * cp
    lin_ms = s.lin_flops / dev.lin_flops_per_ms[comp] + s.mem_bytes / dev.bytes_per_ms[comp]
    rate_bytes = (dev.score_bytes_per_ms or dev.bytes_per_ms)[comp]
    quad_ms = s.quad_flops / dev.quad_flops_per_ms[comp]
    bwd_quad_ms, bwd_lin_ms = BWD_ATTENTION_FACTOR * quad_ms, BWD_MATMUL_FACTOR * lin_ms
    if attention == "eager" and s.attention != "none":
        fwd_bytes, bwd_bytes, _ = _eager_traffic(s)
        if s.attention == "causal":  # the whole score matrix is computed, then masked
            quad_ms *= 2.0
        bwd_quad_ms = EAGER_BWD_ATTENTION_FACTOR * quad_ms  # no recomputation: saved probabilities
        if s.attention == "window":
            lin_ms += fwd_bytes / rate_bytes
            bwd_lin_ms += bwd_bytes / rate_bytes
        else:
            quad_ms += fwd_bytes / rate_bytes
            bwd_quad_ms += bwd_bytes / rate_bytes
    comm_ms, comm_lat = 0.0, 0.0
    if tp > 1 and s.tp_allreduces:
        bw = dev.collective_bytes_per_ms[tp]
        comm_ms += s.tp_allreduces * 2.0 * (tp - 1) / tp * (2.0 * s.hidden) / cp / bw
        comm_lat += s.tp_allreduces * dev.collective_latency_ms
    if cp > 1 and s.cp_kv_bytes:
        comm_ms += (cp - 1) / cp * s.cp_kv_bytes / tp / dev.collective_bytes_per_ms[cp]
        comm_lat += dev.collective_latency_ms
    k = (dev.kind_scales or {}).get(fitted_kind(s.kind), {})
    f, b, fc, bc = (k.get(x, 1.0) for x in ("fwd", "bwd", "fwd_const", "bwd_const"))
    fwd = Quadratic(
        f * quad_ms / shard, f * lin_ms / shard + comm_ms, fc * dev.fwd_call_ms[comp] / num_layers + comm_lat
    )
    bwd = Quadratic(
        b * bwd_quad_ms / shard,
        b * bwd_lin_ms / shard + comm_ms * (2.0 if s.cp_kv_bytes and cp > 1 else 1.0),
        bc * dev.bwd_call_ms[comp] / num_layers + comm_lat,
    )
    return fwd, bwd


def _layer_cost(
    s: LayerSpec, dev: DeviceModel, num_layers: int, trainable: bool, attention: str = "flash"
) -> LayerCost:
    fwd, bwd = {}, {}
    for tp in TP_DEGREES:
        if s.max_tp % tp:
            continue
        for cp in CP_DEGREES:
            key = parallel_key(tp, cp)
            fwd[key], bwd[key] = _quadratics(s, dev, num_layers, tp, cp, attention)
    saved = _eager_traffic(s)[2] if attention == "eager" else 0.0
    window = s.attention == "window"
    scales = (dev.kind_scales or {}).get(fitted_kind(s.kind), {})
    return LayerCost(
        split_extra_fraction=scales.get("split_extra_fraction", 0.0),
        split_extra_ms=scales.get("split_extra_ms", 0.0),
        name=s.name,
        kind=s.kind,
        fwd=fwd,
        bwd=bwd,
        activation_bytes_per_token=s.activation_bytes_per_token + (saved if window else 0.0),
        activation_bytes_per_token_sq=0.0 if window else saved,
        output_bytes_per_token=s.output_bytes_per_token,
        param_bytes=2.0 * s.param_count,
        kv_param_bytes=2.0 * s.kv_params,
        kv_heads=s.kv_heads,
        trainable=trainable,
        bwd_input_fraction=0.0
        if s.kind in ("patch_embed", "embedding")
        else (dev.bwd_input_fraction or {}).get(s.kind, 0.5),
        selective_bytes_per_token=s.attn_saved_bytes + (saved if window else 0.0),
        selective_fwd_fraction=s.attn_lin_flops / s.lin_flops if s.lin_flops > 0 else 0.0,
        per_label=s.per_label,
        message_parts=s.message_parts,
        no_cut_after=s.no_cut_after,
        experts=_expert_cost(s, dev),
    )


def _expert_cost(s: LayerSpec, dev: DeviceModel) -> ExpertCost | None:
    """A sparse layer's ``ExpertCost``: the experts' share of its linear time (at TP = CP = 1), the
    all-to-all bytes of one token (dispatch and combine of its ``top_k`` bf16 hidden rows), the experts'
    bf16 parameter bytes."""
    x = s.experts
    if x is None:
        return None
    comp = s.component
    lin_ms = s.lin_flops / dev.lin_flops_per_ms[comp] + s.mem_bytes / dev.bytes_per_ms[comp]
    fraction = x.lin_flops / dev.lin_flops_per_ms[comp] / lin_ms if lin_ms > 0 else 0.0
    return ExpertCost(
        x.num_experts, x.top_k, fraction, 2.0 * x.top_k * s.hidden * 2.0, 2.0 * x.param_count, x.skew
    )


# --- A40 -------------------------------------------------------------------------------------------
A40_PEAK_BF16_FLOPS_PER_MS = 149.7e9
A40_MEMORY_BYTES_PER_MS = 696e6
A40_FLOPS_EFFICIENCY = 0.45
"""``a40-flops``: one factor for every layer and component (typical large-GEMM utilisation on A40)."""
A40_FWD_CALL_MS_PER_LAYER = 0.03
A40_BWD_CALL_MS_PER_LAYER = 0.06
A40_COLLECTIVE_BYTES_PER_MS = {1: 1e12, 2: 50e6, 4: 12e6, 8: 10e6}
"""TP/CP link per degree: an NVLink pair (2), PCIe 4.0 within a node (4), 200 Gb/s InfiniBand (8)."""
A40_SPEC = HardwareSpec(
    name="a40",
    device_memory_bytes=48e9,
    p2p_bandwidth_bytes_per_ms=25e6,
    p2p_latency_ms=0.01,
    allreduce_bandwidth_bytes_per_ms=12.5e6,
    allreduce_latency_ms=0.05,
    encoder_min_efficient_tokens=512.0,
    llm_min_efficient_tokens=256.0,
)
"""Small calls (docs/cost_model.md, "Small calls"): the rows that give each of the A40's 84 SMs one
128x128 output tile of a layer's widest GEMM: ViT MLP (3,420 columns = 27 tiles, 4 row tiles = 512
patches), Llama 3.2 MLP (8,192 columns = 64 tiles, 2 row tiles = 256 tokens)."""


def fitted(name: str) -> dict:
    """The numbers a fit of ``benchmarks/`` wrote for a preset: ``entrain/core/costs/fits/NAME.json``."""
    return json.loads(resources.files("entrain.core.costs").joinpath(f"fits/{name}.json").read_text())


# Fitted by benchmarks/fit_a40_paper.py (see benchmarks/results/a40_paper_fit.md and docs/cost_model.md):
# per-component efficiency factors (fraction of the bf16 peak) of the a40-paper preset.
_A40_PAPER_FIT = fitted("a40_paper")
A40_PAPER_EFFICIENCY = {
    "encoder": _A40_PAPER_FIT["encoder"],
    "llm": {
        **_A40_PAPER_FIT["llm"],
        "qwen25vl-fullatt-llama3-1b": _A40_PAPER_FIT["llm"]["qwen25vl-llama3-1b"],
        "tiny": _A40_PAPER_FIT["llm"]["qwen25vl-llama3-1b"],
    },
}
"""Only ``encoder / llm`` matters for the GPU splits (all 8 b=256 splits of Tables 2, 5-11 reproduced);
the common level makes paper Eq. 2 times of Table 1's Entrain configs match Fig. 11 in the geometric
mean. ``tiny`` and ``qwen25vl-fullatt-llama3-1b`` borrow the 1B factor."""


# Fitted by benchmarks/fit_a40_fig4.py (see benchmarks/results/a40_fig4_fit.md and docs/cost_model.md).
A40_FIG4_EFFICIENCY = {k: fitted("a40_fig4")[k] for k in ("llm", "scores")}
"""``a40-fig4``: the setup of paper Fig. 4 (per-sample encoder:LLM ratios of a full-attention
"Qwen2Vision" tower with eager attention next to Llama3-1B). Encoder GEMMs at ``a40-flops``' 0.45;
fitted: the LLM's efficiency (one ~400-token sample per call) and the memory rate of the eager
score traffic, both as fractions of the A40's peak."""


def a40_device(name: str, model: str, encoder_eff: float, llm_eff: float, layer_counts: dict) -> DeviceModel:
    eff = {"encoder": encoder_eff, "llm": llm_eff}
    return DeviceModel(
        spec=replace(A40_SPEC, name=name),
        lin_flops_per_ms={c: A40_PEAK_BF16_FLOPS_PER_MS * e for c, e in eff.items()},
        quad_flops_per_ms={c: A40_PEAK_BF16_FLOPS_PER_MS * e for c, e in eff.items()},
        bytes_per_ms={c: A40_MEMORY_BYTES_PER_MS * e for c, e in eff.items()},
        fwd_call_ms={c: A40_FWD_CALL_MS_PER_LAYER * n for c, n in layer_counts.items()},
        bwd_call_ms={c: A40_BWD_CALL_MS_PER_LAYER * n for c, n in layer_counts.items()},
        collective_bytes_per_ms=A40_COLLECTIVE_BYTES_PER_MS,
        collective_latency_ms=0.02,
        notes={"encoder_efficiency": encoder_eff, "llm_efficiency": llm_eff},
    )


# --- CPU (tiny) --------------------------------------------------------------------------------------
# Single-thread thread-CPU time of the tiny model (docs/design.md §6.9), forward +
# backward with a 7 ms + 7 ms per-call constant: LLM (vocab 1000, logits at all tokens) 0.064 ms/token +
# 5.35e-5 ms/token^2 (fit of the T=64..4096 table, relative error within 26 %); vision 0.11 ms/patch
# (between the single-image fit 0.094 and packed 256-patch images 0.143) + 4.9e-5 ms/patch^2.
CPU_TINY_LLM_MS_PER_TOKEN = 0.064
CPU_TINY_LLM_MS_PER_TOKEN2 = 5.35e-5
CPU_TINY_MEASURED_VOCAB = 1000
CPU_TINY_VISION_MS_PER_PATCH = 0.11
CPU_TINY_VISION_MS_PER_PATCH2 = 4.9e-5
CPU_TINY_FWD_CALL_MS = 7.0
CPU_TINY_BWD_CALL_MS = 7.0
CPU_TINY_BWD_INPUT_FRACTION = {
    "vit_block_window": 0.85,
    "vit_block_full": 0.85,
    "merger": 0.55,
    **dict.fromkeys(("decoder_layer", "final_norm", "lm_head", "loss"), 0.72),
}
"""Input-gradient share of a split backward (``I / (I + W)``) on the tiny CPU runs, not the matmuls'
0.5: the ``I`` walks the whole graph (attention, norms, activations, the loss) and only the weight
matmuls wait for ``W``. Measured per stage in the Entrain traces of ``cpu_pipeline.py --paired``
(3 launches x 4 workloads, one idle: a ratio of one rank's own actions, steady under load): LLM stages 0.69-0.75 (0.56-0.58 on chartqa's 100-token samples),
the merger alone 0.54-0.60, the full-attention block + merger 0.81-0.82 (docs/cost_model.md)."""
KIND_GROUPS = {"patch_embed": "vit_block_window", "final_norm": "head", "lm_head": "head", "loss": "head"}
"""Layer kinds fitted as one (``fitted_kind``): too little time of their own, always in one stage with
the kind they join, to be told apart in a trace."""


def fitted_kind(kind: str) -> str:
    """The kind ``kind``'s measured corrections are fitted and kept under (``KIND_GROUPS``)."""
    return KIND_GROUPS.get(kind, kind)


CPU_TINY_FIT = fitted("cpu_tiny")
"""``entrain/core/costs/fits/cpu_tiny.json``, which ``benchmarks/fit_cpu_tiny.py`` writes (its report:
``benchmarks/results/cpu_tiny_fit.md``)."""
CPU_TINY_KIND_SCALES: dict[str, dict[str, float]] = CPU_TINY_FIT["kind_scales"]
"""Per fitted kind (``fitted_kind``), the analytic curves' corrections measured on traced runs
(``benchmarks/fit_cpu_tiny.py``, ``benchmarks/results/cpu_tiny_fit.md``; ``DeviceModel.kind_scales``)."""
CPU_TINY_ACTION_OVERHEAD_MS: float = CPU_TINY_FIT["action_overhead_ms"]
"""Per compute action, outside its layers (``HardwareSpec.action_overhead_ms``), from the same fit."""
CPU_SPEC = HardwareSpec(
    name="cpu-tiny",
    device_memory_bytes=8e9,
    p2p_bandwidth_bytes_per_ms=2.5e6,
    p2p_latency_ms=0.1,
    allreduce_bandwidth_bytes_per_ms=0.8e6,
    allreduce_latency_ms=0.6,
)


def _fb(spec: LayerSpec, term: str) -> float:
    """Forward + backward FLOPs of one term (``lin`` or ``quad``) per unit power of x."""
    if term == "lin":
        return (1.0 + BWD_MATMUL_FACTOR) * spec.lin_flops
    return (1.0 + BWD_ATTENTION_FACTOR) * spec.quad_flops


def _cpu_device(layer_counts: dict, traced: bool = True) -> DeviceModel:
    """``cpu-tiny``'s rates; ``traced``: with the corrections fitted on traced runs."""
    tiny = get_arch("tiny")
    measured = layer_specs(replace(tiny, llm=replace(tiny.llm, vocab_size=CPU_TINY_MEASURED_VOCAB)), 1.0)
    vis, llm = measured["encoder"], measured["llm"]
    lin = {
        "encoder": sum(_fb(s, "lin") for s in vis) / CPU_TINY_VISION_MS_PER_PATCH,
        "llm": sum(_fb(s, "lin") for s in llm) / CPU_TINY_LLM_MS_PER_TOKEN,
    }
    quad = {
        "encoder": sum(_fb(s, "quad") for s in vis) / CPU_TINY_VISION_MS_PER_PATCH2,
        "llm": sum(_fb(s, "quad") for s in llm) / CPU_TINY_LLM_MS_PER_TOKEN2,
    }
    return DeviceModel(
        spec=replace(CPU_SPEC, action_overhead_ms=CPU_TINY_ACTION_OVERHEAD_MS) if traced else CPU_SPEC,
        lin_flops_per_ms=lin,
        quad_flops_per_ms=quad,
        bytes_per_ms={"encoder": 5e6, "llm": 5e6},
        fwd_call_ms={c: CPU_TINY_FWD_CALL_MS for c in layer_counts},
        bwd_call_ms={c: CPU_TINY_BWD_CALL_MS for c in layer_counts},
        collective_bytes_per_ms={1: 1e12, 2: 2.5e6, 4: 1.2e6, 8: 0.6e6},
        collective_latency_ms=0.6,
        notes={"source": "docs/design.md §6.9 (1 thread, thread-CPU time)"},
        bwd_input_fraction=CPU_TINY_BWD_INPUT_FRACTION,
        kind_scales=CPU_TINY_KIND_SCALES if traced else None,
    )


def analytic_cpu_tiny(model: str | ModelShape) -> CostModel:
    """``cpu-tiny`` without the corrections fitted on traced runs (what ``benchmarks/fit_cpu_tiny.py``
    measures them against)."""
    arch = get_arch(model) if isinstance(model, str) else model
    counts = {c: len(v) for c, v in layer_specs(arch, None).items()}
    return cost_model_for(arch, _cpu_device(counts, traced=False), hardware_name="cpu-tiny")


# --------------------------------------------------------------------------------------------------
def _frozen_flags(specs: dict[str, list[LayerSpec]], freeze: Iterable[str]) -> dict[str, list[bool]]:
    freeze = tuple(freeze)
    unknown = [f for f in freeze if f not in FREEZE_OPTIONS]
    if unknown:
        raise ConfigError(f"unknown freeze option(s) {unknown}; choose from {', '.join(FREEZE_OPTIONS)}")
    flags = {c: [True] * len(layers) for c, layers in specs.items()}
    if "llm" in freeze:
        flags["llm"] = [False] * len(specs["llm"])
    if "encoder" in freeze or "vit" in freeze:
        keep_merger = "encoder" not in freeze
        flags["encoder"] = [keep_merger and s.kind == "merger" for s in specs["encoder"]]
    return flags


def cost_model_for(
    arch: ModelShape,
    device: DeviceModel,
    *,
    hardware_name: str,
    freeze: Iterable[str] = (),
    label_fraction: float | None = None,
    attention: str = "flash",
) -> CostModel:
    """Build the per-layer cost model of ``arch`` on ``device`` (public for fits and custom presets)."""
    impl = attention_by_component(attention)
    specs = layer_specs(arch, label_fraction)
    trainable = _frozen_flags(specs, freeze)
    comps = {}
    for comp, layers in specs.items():
        costs = [_layer_cost(s, device, len(layers), t, impl[comp]) for s, t in zip(layers, trainable[comp])]
        if comp == "encoder" and not any(trainable[comp][:-1]) and trainable[comp][-1]:
            # a trainable merger behind a frozen tower computes only its weight gradients
            m = costs[-1]
            w = 1.0 - m.bwd_input_fraction
            costs[-1] = replace(m, bwd={k: Quadratic(q.a * w, q.b * w, q.c * w) for k, q in m.bwd.items()})
        comps[comp] = ComponentCost(comp, tuple(costs))
    notes = dict(device.notes)
    notes.update(
        {
            "preset": f"{arch.name}/{hardware_name}",
            "label_fraction": "per sample" if label_fraction is None else label_fraction,
            "frozen": sorted(set(freeze)),
            "attention": impl,
        }
    )
    return CostModel(
        model=arch.name,
        hardware=replace(device.spec, name=hardware_name),
        encoder=comps["encoder"],
        llm=comps["llm"],
        notes=notes,
    )


def build_cost_model(
    model: str | ModelShape,
    hardware: str,
    *,
    freeze: Iterable[str] = (),
    label_fraction: float | None = None,
    attention: str | None = None,
) -> CostModel:
    """The analytic cost model of a model preset (or any ``ModelArch``, e.g. one read from Hugging Face
    ``config.json`` files by ``entrain.models.families.composition.spec``) on a hardware preset.

    ``freeze``: any of ``FREEZE_OPTIONS``; ``attention``: see ``attention_by_component`` (``None``: the
    hardware preset's ``DEFAULT_ATTENTION``, else flash). ConfigError names the valid choices.
    """
    if attention is None:
        attention = DEFAULT_ATTENTION.get(hardware, "flash")
    freeze = tuple(freeze)
    arch = get_arch(model) if isinstance(model, str) else model
    model = arch.name
    counts = {c: len(v) for c, v in layer_specs(arch, label_fraction).items()}
    if hardware == "a40-flops":
        dev = a40_device(hardware, model, A40_FLOPS_EFFICIENCY, A40_FLOPS_EFFICIENCY, counts)
    elif hardware == "a40-paper":
        llm_eff = A40_PAPER_EFFICIENCY["llm"].get(model, A40_FLOPS_EFFICIENCY)
        dev = a40_device(hardware, model, A40_PAPER_EFFICIENCY["encoder"], llm_eff, counts)
        dev.notes["fit"] = "benchmarks/fit_a40_paper.py"
    elif hardware == "a40-fig4":
        dev = a40_device(hardware, model, A40_FLOPS_EFFICIENCY, A40_FIG4_EFFICIENCY["llm"], counts)
        score_rate = A40_MEMORY_BYTES_PER_MS * A40_FIG4_EFFICIENCY["scores"]
        dev = replace(dev, score_bytes_per_ms={"encoder": score_rate, "llm": score_rate})
        dev.notes.update(
            {"fit": "benchmarks/fit_a40_fig4.py", "score_efficiency": A40_FIG4_EFFICIENCY["scores"]}
        )
    elif hardware == "cpu-tiny":
        dev = _cpu_device(counts)
    else:
        raise ConfigError(f"unknown hardware preset {hardware!r}; choose from {', '.join(HARDWARE_PRESETS)}")
    cost = cost_model_for(
        arch, dev, hardware_name=hardware, freeze=freeze, label_fraction=label_fraction, attention=attention
    )
    tower = getattr(arch, "audio", None)
    if tower is None or getattr(arch, "arch", None) is None:
        return cost
    return _with_audio_tower(cost, arch.arch, tower, hardware, freeze, attention)


def _with_audio_tower(
    cost: CostModel, arch, tower, hardware: str, freeze: Iterable[str], attention: str
) -> CostModel:
    """``cost`` (an omni shape's: ``arch`` its vision tower and LLM, ``tower`` its audio tower's fields) with
    the audio tower's layers on the first encoder layer (``LayerCost.audio``), where the runtime runs it:
    priced from its own layer specs (``model.omni.audio_tower_specs``) on ``hardware``, as the N-encoder
    planner prices its audio pipeline (``planning.encoders.price_encoder``), over the sample's audio rows
    only (``CostModel.units``), instead of as rows of the vision tower's layers."""
    heard = build_cost_model(
        EncoderSwapped(arch, audio_tower_specs(tower)), hardware, freeze=freeze, attention=attention
    )
    first = replace(cost.encoder.layers[0], audio=heard.encoder.layers)
    return replace(cost, encoder=replace(cost.encoder, layers=(first, *cost.encoder.layers[1:])))


def default_hardware(model: str) -> str:
    """The hardware preset a model is priced on when ``--hardware`` is not given."""
    return "cpu-tiny" if model == "tiny" else "a40-paper"


def resolve_cost_model(
    model: str | ModelShape,
    *,
    hardware: str | None = None,
    profile: str | None = None,
    attention: str | None = None,
    freeze: Iterable[str] = (),
) -> CostModel:
    """The one place a command's cost model comes from: the measured ``profile`` (checked to be of
    ``model``), else the analytic preset of ``model`` on ``hardware`` (default ``default_hardware``)
    with ``attention`` and the frozen parts. A profile timed its own attention and trainable parts,
    so ``attention`` or ``freeze`` with a profile is refused."""
    freeze = tuple(freeze)
    name = model if isinstance(model, str) else model.name
    if profile:
        if freeze:
            raise ConfigError(
                "--freeze applies to presets; a measured --profile carries its own trainable flags"
            )
        if attention:
            raise ConfigError("--attention applies to presets; a measured --profile timed its own attention")
        return CostModel.load(profile, expect_model=name)
    return build_cost_model(model, hardware or default_hardware(name), freeze=freeze, attention=attention)
