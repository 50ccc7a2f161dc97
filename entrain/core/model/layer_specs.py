"""Layer specifications: the hardware-independent work of one layer per sequence unit (``LayerSpec``),
what a model family's ``ModelShape.layer_specs`` returns and ``entrain.core.costs.presets`` prices; and the
analytic specs of a ViT tower feeding a decoder-only LM (``vit_decoder_layer_specs``: the
``VisionArch`` and ``LLMArch`` of an ``entrain.core.model.architectures.ModelArch``; see ``presets``' module
docstring for the modelling choices)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from entrain.core.workload.samples import LABEL_FRACTION

__all__ = ["HIDDEN", "MessagePart", "ExpertSpec", "LayerSpec", "llm_specs", "vit_decoder_layer_specs"]

HIDDEN = "hidden"
"""The name of a stage message's main part (the hidden states every family sends)."""
PART_ROWS = ("tokens", "image_tokens", "audio_tokens")
_PART_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class MessagePart:
    """A named tensor ``[rows, width]`` that crosses a stage boundary besides ``HIDDEN`` (e.g. the
    DeepStack features a vision encoder hands to the first LLM layers). ``rows``: ``tokens`` counts
    the sending component's token unit (encoder input patches, LLM tokens) times ``rows_per_token``;
    ``image_tokens`` one row per image feature row of the samples, ``audio_tokens`` one per audio
    token of the samples (``SampleMeta.audio_tokens``). Bytes = rows * width * dtype_bytes."""

    name: str
    width: int
    dtype_bytes: int = 2
    rows: str = "tokens"
    rows_per_token: float = 1.0

    def __post_init__(self) -> None:
        if not _PART_NAME.match(self.name) or self.name == HIDDEN:
            raise ValueError(f"message part name {self.name!r}: [a-z][a-z0-9_]*, not {HIDDEN!r}")
        if self.rows not in PART_ROWS:
            raise ValueError(f"message part {self.name!r}: rows {self.rows!r}, expected one of {PART_ROWS}")
        if self.width < 0 or self.dtype_bytes <= 0 or self.rows_per_token < 0:
            raise ValueError(f"message part {self.name!r}: negative width, rows or dtype size")

    def bytes_for(self, tokens: float, image_tokens: float, audio_tokens: float = 0.0) -> float:
        """Bytes of this part in a message of ``tokens`` component tokens, ``image_tokens`` image
        feature rows and ``audio_tokens`` audio tokens (callers that do not count audio price an
        ``audio_tokens`` part at nothing)."""
        if self.rows == "tokens":
            rows = tokens * self.rows_per_token
        else:
            rows = audio_tokens if self.rows == "audio_tokens" else image_tokens
        return rows * self.width * self.dtype_bytes

    def to_json(self) -> dict:
        out = {"name": self.name, "width": self.width, "dtype_bytes": self.dtype_bytes, "rows": self.rows}
        if self.rows_per_token != 1.0:
            out["rows_per_token"] = self.rows_per_token
        return out

    @classmethod
    def from_json(cls, d: dict) -> MessagePart:
        return cls(
            str(d["name"]),
            int(d["width"]),
            int(d.get("dtype_bytes", 2)),
            str(d.get("rows", "tokens")),
            float(d.get("rows_per_token", 1.0)),
        )


@dataclass(frozen=True, slots=True)
class ExpertSpec:
    """The mixture of experts of a sparse layer (its ``LayerSpec`` counts the router and the ``top_k``
    active experts at a balanced load in ``lin_flops``, every expert in ``param_count``): ``num_experts``
    experts, ``top_k`` per token; ``lin_flops`` / ``param_count`` of those are the experts' (what a
    busier expert multiplies, what expert parallelism shards); ``skew``: the routing model's skew
    (1 = a uniform router; docs/design.md, "Mixture-of-experts costs")."""

    num_experts: int
    top_k: int
    lin_flops: float
    param_count: int
    skew: float = 1.0

    def __post_init__(self) -> None:
        if (
            not 0 < self.top_k <= self.num_experts
            or self.lin_flops < 0
            or self.param_count < 0
            or self.skew < 1
        ):
            raise ValueError(
                f"experts: {self.num_experts} experts, top-k {self.top_k}, skew {self.skew}: expected "
                "0 < top-k <= experts, non-negative sizes and skew >= 1"
            )


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """Forward work of one layer for one sequence unit of ``x`` tokens:
    ``quad_flops * x^2 + lin_flops * x`` FLOPs and ``mem_bytes * x`` memory traffic (memory-bound
    layers). Collectives: ``tp_allreduces`` all-reduces of ``x * hidden * 2`` bytes per phase under
    TP; ``cp_kv_bytes * x`` bytes of K/V gathered per phase under CP."""

    name: str
    kind: str
    component: str
    quad_flops: float
    lin_flops: float
    mem_bytes: float
    hidden: int
    tp_allreduces: int
    cp_kv_bytes: float
    max_tp: int
    activation_bytes_per_token: float
    output_bytes_per_token: float
    param_count: int
    attention: str = "none"
    """Score pattern of an attention layer: ``full`` (bidirectional within a unit), ``causal`` (a
    sample's causal mask), ``window`` (each token attends its ``window`` tokens), ``none``."""
    heads: int = 0
    """Query heads whose score matrices an eager implementation materialises."""
    window: int = 0
    attn_lin_flops: float = 0.0
    """Of ``lin_flops``: the attention sub-block's (QKV and output projections, window scores)."""
    attn_saved_bytes: float = 0.0
    """Of ``activation_bytes_per_token``: what the attention sub-block saves beyond its input (its
    norm output, Q, K, V, the attention output; selective recomputation drops these)."""
    per_label: bool = False
    """``x`` counts label tokens (``LayerCost.per_label``)."""
    kv_params: int = 0
    """Of ``param_count``: the K/V projections' (weights and biases) of a decoder layer."""
    kv_heads: int = 0
    """KV heads of a decoder layer: with fewer than TP ranks its K/V projections are replicated."""
    message_parts: tuple[MessagePart, ...] = ()
    """The parts besides ``HIDDEN`` a stage boundary right after this layer carries (every part a
    later stage needs, on every boundary it crosses)."""
    no_cut_after: bool = False
    """The partitioner must not end a stage after this layer."""
    experts: ExpertSpec | None = None
    """A sparse (mixture-of-experts) layer's experts; None: a dense layer."""


def _vision_specs(v) -> list[LayerSpec]:
    """The vision tower of ``v`` (an ``entrain.core.model.architectures.VisionArch``)."""
    h, i = v.hidden_size, v.intermediate_size
    block_lin = 2.0 * (4 * h * h + v.mlp_matrices * h * i)
    block_act = 16.0 * h + 2.0 * v.mlp_matrices * i
    specs = [
        LayerSpec(
            "patch_embed",
            "patch_embed",
            "encoder",
            0.0,
            2.0 * v.patch_dim * h,
            0.0,
            h,
            0,
            0.0,
            v.num_heads,
            2.0 * v.patch_dim,
            2.0 * h,
            v.patch_embed_params(),
        ),
    ]
    for b in range(v.depth):
        full = v.is_full_attention(b)
        if full:
            quad, lin, kind, kv = 4.0 * h, block_lin, "vit_block_full", 2.0 * 2 * h
        else:  # each patch attends its 64-patch window: QK^T and AV are 2*h*w FLOPs each
            quad, lin, kind, kv = 0.0, block_lin + 4.0 * h * v.window_patches, "vit_block_window", 0.0
        specs.append(
            LayerSpec(
                f"blocks.{b}",
                kind,
                "encoder",
                quad,
                lin,
                0.0,
                h,
                2,
                kv,
                v.num_heads,
                block_act,
                2.0 * h,
                v.block_params(),
                attention="full" if full else "window",
                heads=v.num_heads,
                window=0 if full else v.window_patches,
                attn_lin_flops=lin - 2.0 * 3 * h * i,
                attn_saved_bytes=10.0 * h,
            )
        )
    m = v.merger_hidden
    merger_lin = (2.0 * m * m + 2.0 * m * v.out_hidden_size) / v.merge_factor
    specs.append(
        LayerSpec(
            "merger",
            "merger",
            "encoder",
            0.0,
            merger_lin,
            0.0,
            h,
            0,
            0.0,
            v.num_heads,
            8.0 * h,
            2.0 * v.out_hidden_size / v.merge_factor,
            v.merger_params(),
        )
    )
    return specs


def llm_specs(llm, label_fraction: float | None) -> list[LayerSpec]:
    """The LLM of ``llm`` (an ``entrain.core.model.architectures.LLMArch``): embedding, decoder layers, and
    the head layers (``_llm_head_specs``)."""
    h, i, q, kv = llm.hidden_size, llm.intermediate_size, llm.q_dim, llm.kv_dim
    layer_lin = 2.0 * (h * q + 2 * h * kv + q * h + 3 * h * i)
    layer_act = 8.0 * h + 4.0 * q + 4.0 * kv + 6.0 * i
    heads = llm.num_attention_heads
    specs = [
        LayerSpec(
            "embed_tokens",
            "embedding",
            "llm",
            0.0,
            0.0,
            4.0 * h,
            h,
            0,
            0.0,
            heads,
            0.0,
            2.0 * h,
            llm.embedding_params(),
        )
    ]
    for n in range(llm.num_hidden_layers):
        specs.append(
            LayerSpec(
                f"layers.{n}",
                "decoder_layer",
                "llm",
                2.0 * q,
                layer_lin,
                0.0,
                h,
                2,
                2.0 * 2 * kv,
                heads,
                layer_act,
                2.0 * h,
                llm.layer_params(),
                attention="causal",
                heads=heads,
                attn_lin_flops=2.0 * (h * q + 2 * h * kv + q * h),
                attn_saved_bytes=2.0 * h + 4.0 * q + 4.0 * kv,
                kv_params=llm.kv_params(),
                kv_heads=llm.num_key_value_heads,
            )
        )
    return specs + _llm_head_specs(llm, label_fraction)


def _llm_head_specs(llm, label_fraction: float | None) -> list[LayerSpec]:
    """The final norm, lm_head and loss of ``llm``. Heads: time per label token (f = 1), bytes per LLM
    token at the default share; or both per LLM token at an explicit ``label_fraction``."""
    h, heads = llm.hidden_size, llm.num_attention_heads
    per_label = label_fraction is None
    vocab, f = llm.vocab_size, 1.0 if per_label else label_fraction
    fb = LABEL_FRACTION if per_label else label_fraction
    return [
        LayerSpec("norm", "final_norm", "llm", 0.0, 0.0, 4.0 * h, h, 0, 0.0, heads, 2.0 * h, 2.0 * h, h),
        LayerSpec(
            "lm_head",
            "lm_head",
            "llm",
            0.0,
            f * 2.0 * h * vocab,
            0.0,
            h,
            0,
            0.0,
            heads,
            fb * 2.0 * h,
            fb * 2.0 * vocab,
            llm.lm_head_params(),
            per_label=per_label,
        ),
        # cross-entropy: read bf16 logits, write/read fp32 softmax; saves fp32 softmax + bf16 logits
        LayerSpec(
            "loss",
            "loss",
            "llm",
            0.0,
            f * 5.0 * vocab,
            f * 10.0 * vocab,
            h,
            0,
            0.0,
            heads,
            fb * 6.0 * vocab,
            4.0 * fb,
            0,
            per_label=per_label,
        ),
    ]


def vit_decoder_layer_specs(arch, label_fraction: float | None) -> dict[str, list[LayerSpec]]:
    """``ModelArch.layer_specs`` (``arch``: an ``entrain.core.model.architectures.ModelArch``): its ViT tower
    with patch merger, and its decoder-only LM."""
    return {"encoder": _vision_specs(arch.vision), "llm": llm_specs(arch.llm, label_fraction)}
