"""Model architectures as plain numbers: the single source for cost presets and model builders.

Field names follow the Hugging Face config classes (``Qwen2_5_VLVisionConfig`` for the vision tower,
``LlamaConfig`` for the LLM) so ``entrain.models`` can build configs with ``VisionArch.hf_kwargs()``
/ ``LLMArch.hf_kwargs()``. Parameter counts are computed here analytically and match
``sum(p.numel())`` of the transformers modules (checked in ``tests/core/test_presets.py`` against
numbers measured once with transformers 5.24.0).

Presets:

* ``qwen25vl-llama3-1b``: Qwen2.5-VL vision tower (675M class: depth 32, hidden 1280, 16 heads,
  window attention within 112-px windows, full attention in blocks 7/15/23/31, merger MLP to the
  LLM width) + Llama-3.2-1B (16 layers, hidden 2048, 32 heads, 8 KV heads, tied embeddings) with
  the Qwen2 tokenizer vocabulary (151,936 ids).
* ``qwen25vl-llama3-3b``: the same vision tower + Llama-3.2-3B (28 layers, hidden 3072, 24 heads,
  8 KV heads, tied embeddings), vocabulary 151,936.
* ``qwen25vl-fullatt-llama3-1b``: the 1B preset with full attention in every vision block, i.e. the
  attention pattern of Qwen2-VL's vision tower, which paper Fig. 4 and Table 1 name "Qwen2Vision"
  (Qwen2-VL's LayerNorm and 2-matrix GELU MLP of width 5120 differ from this SwiGLU 3420 by under
  0.3 % in FLOPs and parameters; the 1B preset's window attention is the paper's evaluation model).
* ``tiny``: a 2-block vision tower and a 2-layer LLM (hidden 128, vocabulary 4,096, untied) for CPU
  tests and demos.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from entrain.core.errors import ConfigError

__all__ = [
    "VisionArch",
    "LLMArch",
    "ModelArch",
    "MODEL_PRESETS",
    "QWEN2_VOCAB_SIZE",
    "get_arch",
]

PRECISIONS = ("fp32", "bf16")
"""Compute precisions of ``entrain train --precision`` (bf16: autocast over fp32 master weights)."""

NORM_KINDS = ("rms", "layer")
"""``VisionArch.norm``: RMSNorm (a scale per unit) or LayerNorm (scale and bias)."""
MLP_KINDS = ("gated", "plain")
"""``VisionArch.mlp``: a gated MLP (gate, up and down matrices) or a plain one (two matrices)."""

QWEN2_VOCAB_SIZE = 151_936
"""Qwen2 / Qwen2.5 tokenizer vocabulary (embedding rows of the released checkpoints)."""


def default_precision(device_type: str) -> str:
    """The precision ``entrain train`` and ``entrain profile`` compute in without ``--precision``: bf16
    on CUDA, fp32 elsewhere."""
    return "bf16" if device_type == "cuda" else "fp32"


@dataclass(frozen=True, kw_only=True, slots=True)
class VisionArch:
    """A ViT tower with a patch merger, described by its properties: patch embedding (Conv3d without
    bias), ``depth`` blocks (two norms of kind ``norm``, fused QKV with bias, an MLP of kind ``mlp``
    with bias; window attention except in ``fullatt_block_indexes``), patch merger (a norm + a 2-layer
    MLP to the LLM width). A model family maps its ``config.json`` onto these fields (e.g. Qwen2.5-VL's
    tower: RMSNorm, gated MLP, 112-px windows; Qwen2-VL's: LayerNorm, plain MLP, full attention)."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    """Merger output width = the LLM's hidden size."""
    fullatt_block_indexes: tuple[int, ...]
    window_size: int = 112
    """Window side in pixels for the window-attention blocks (112 px = 8x8 patches = 64 patches)."""
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    hidden_act: str = "silu"
    norm: str = "rms"
    """Kind of every norm (``NORM_KINDS``): ``rms`` (RMSNorm) or ``layer`` (LayerNorm with bias)."""
    mlp: str = "gated"
    """Kind of each block's MLP (``MLP_KINDS``): ``gated`` (SwiGLU: gate, up, down) or ``plain``
    (``fc1`` / ``fc2``)."""
    min_pixels: int | None = None
    """The checkpoint's image processor limits (its ``preprocessor_config.json``): the defaults of
    ``--min-pixels`` / ``--max-pixels``; None: Qwen's (``entrain.core.workload.samples.DEFAULT_VISION``)."""
    max_pixels: int | None = None

    def __post_init__(self) -> None:
        if self.norm not in NORM_KINDS:
            raise ConfigError(f"vision norm {self.norm!r}; expected one of {', '.join(NORM_KINDS)}")
        if self.mlp not in MLP_KINDS:
            raise ConfigError(f"vision mlp {self.mlp!r}; expected one of {', '.join(MLP_KINDS)}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"vision hidden_size {self.hidden_size} not divisible by num_heads {self.num_heads}"
            )
        bad = [i for i in self.fullatt_block_indexes if not 0 <= i < self.depth]
        if bad:
            raise ConfigError(f"fullatt_block_indexes {bad} outside 0..{self.depth - 1}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Input features of one flattened patch: channels x temporal x patch x patch (1176)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def window_patches(self) -> int:
        """Patches in one attention window (64 for 112-px windows of 14-px patches)."""
        return (self.window_size // self.patch_size) ** 2

    @property
    def merge_factor(self) -> int:
        """Patches merged into one LLM token (4)."""
        return self.spatial_merge_size**2

    @property
    def merger_hidden(self) -> int:
        return self.hidden_size * self.merge_factor

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of a block's MLP: 3 (gated) or 2 (plain: fc1/fc2)."""
        return 3 if self.mlp == "gated" else 2

    @property
    def norm_params_per_width(self) -> int:
        """Parameters of one norm per hidden unit: 1 (RMSNorm) or 2 (LayerNorm, with bias)."""
        return 2 if self.norm == "layer" else 1

    def is_full_attention(self, block: int) -> bool:
        return block in self.fullatt_block_indexes

    # --- parameter counts -------------------------------------------------------------------------
    def patch_embed_params(self) -> int:
        return self.patch_dim * self.hidden_size  # Conv3d without bias

    def block_params(self) -> int:
        h, i = self.hidden_size, self.intermediate_size
        norms = 2 * h * self.norm_params_per_width
        attn = (3 * h * h + 3 * h) + (h * h + h)
        mlp = (self.mlp_matrices - 1) * (h * i + i) + (i * h + h)
        return norms + attn + mlp

    def merger_params(self) -> int:
        m = self.merger_hidden
        return (
            self.hidden_size * self.norm_params_per_width
            + (m * m + m)
            + (m * self.out_hidden_size + self.out_hidden_size)
        )

    def num_params(self) -> int:
        return self.patch_embed_params() + self.depth * self.block_params() + self.merger_params()

    def hf_kwargs(self) -> dict:
        """Keyword arguments for ``transformers``' ``Qwen2_5_VLVisionConfig``."""
        return {
            "depth": self.depth,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_heads": self.num_heads,
            "out_hidden_size": self.out_hidden_size,
            "fullatt_block_indexes": list(self.fullatt_block_indexes),
            "window_size": self.window_size,
            "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size,
            "spatial_merge_size": self.spatial_merge_size,
            "in_channels": self.in_channels,
            "hidden_act": self.hidden_act,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class LLMArch:
    """A decoder-only LM described by its properties: token embedding, decoder layers (RMSNorm, GQA
    attention, SwiGLU MLP; biases per ``qkv_bias`` / ``attention_bias`` / ``mlp_bias``), final RMSNorm,
    lm_head (tied to the embedding or not). Field names follow ``LlamaConfig``; a model family maps
    its ``config.json`` onto them (e.g. Qwen2's decoder: ``qkv_bias=True``)."""

    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    head_dim: int | None = None
    """``None`` (the default) becomes ``hidden_size // num_attention_heads``."""
    rope_theta: float = 500_000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 131_072
    hidden_act: str = "silu"
    qkv_bias: bool = False
    """q/k/v projections with bias, the output projection without (Qwen2's decoder)."""
    attention_bias: bool = False
    """``LlamaConfig.attention_bias``: q/k/v/o projections with bias."""
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads {self.num_attention_heads} not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(
                    f"hidden_size {self.hidden_size} not divisible by num_attention_heads {self.num_attention_heads}"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    # --- parameter counts -------------------------------------------------------------------------
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def layer_params(self) -> int:
        h, i = self.hidden_size, self.intermediate_size
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        return 2 * h + attn + 3 * h * i + self.layer_bias_params()

    def layer_bias_params(self) -> int:
        qkv = self.q_dim + 2 * self.kv_dim
        attn = qkv * (self.qkv_bias or self.attention_bias) + self.hidden_size * self.attention_bias
        return attn + (2 * self.intermediate_size + self.hidden_size) * self.mlp_bias

    def kv_params(self) -> int:
        """Of ``layer_params``: the K and V projections' (weights and biases)."""
        return 2 * self.kv_dim * (self.hidden_size + (self.qkv_bias or self.attention_bias))

    def lm_head_params(self) -> int:
        """Parameters the lm_head adds (0 when tied to the embedding)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def num_params(self) -> int:
        h = self.hidden_size
        return (
            self.embedding_params() + self.num_hidden_layers * self.layer_params() + h + self.lm_head_params()
        )

    def hf_kwargs(self) -> dict:
        """Keyword arguments for ``transformers``' ``LlamaConfig``."""
        return {
            "num_hidden_layers": self.num_hidden_layers,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "head_dim": self.head_dim,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": self.hidden_act,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelArch:
    """A vision-language model: vision tower (incl. merger) + LLM."""

    name: str
    vision: VisionArch
    llm: LLMArch
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.vision.out_hidden_size != self.llm.hidden_size:
            raise ConfigError(
                f"{self.name}: the vision merger outputs {self.vision.out_hidden_size} features but the LLM's "
                f"hidden size is {self.llm.hidden_size}: the image features cannot replace its token embeddings "
                "(use a vision checkpoint whose merger projects to the LLM width)"
            )

    def num_params(self) -> int:
        return self.vision.num_params() + self.llm.num_params()

    def layer_specs(self, label_fraction: float | None = None) -> dict:
        """``ModelShape.layer_specs`` (``entrain.core.model.layer_specs.vit_decoder_layer_specs``)."""
        from entrain.core.model.layer_specs import vit_decoder_layer_specs

        return vit_decoder_layer_specs(self, label_fraction)


def _qwen25_vit(out_hidden_size: int, fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)) -> VisionArch:
    return VisionArch(
        depth=32,
        hidden_size=1280,
        intermediate_size=3420,
        num_heads=16,
        out_hidden_size=out_hidden_size,
        fullatt_block_indexes=fullatt_block_indexes,
    )


LLAMA32_1B = LLMArch(
    num_hidden_layers=16,
    hidden_size=2048,
    intermediate_size=8192,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=QWEN2_VOCAB_SIZE,
    tie_word_embeddings=True,
)
LLAMA32_3B = LLMArch(
    num_hidden_layers=28,
    hidden_size=3072,
    intermediate_size=8192,
    num_attention_heads=24,
    num_key_value_heads=8,
    vocab_size=QWEN2_VOCAB_SIZE,
    tie_word_embeddings=True,
)

MODEL_PRESETS: dict[str, ModelArch] = {
    "tiny": ModelArch(
        name="tiny",
        vision=VisionArch(
            depth=2,
            hidden_size=128,
            intermediate_size=256,
            num_heads=4,
            out_hidden_size=128,
            fullatt_block_indexes=(1,),
        ),
        llm=LLMArch(
            num_hidden_layers=2,
            hidden_size=128,
            intermediate_size=256,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=4096,
            tie_word_embeddings=False,
            max_position_embeddings=16_384,
            rope_theta=10_000.0,
        ),
        description="2-block ViT + 2-layer decoder, hidden 128, vocab 4096 (CPU tests and demos)",
    ),
    "qwen25vl-llama3-1b": ModelArch(
        name="qwen25vl-llama3-1b",
        vision=_qwen25_vit(LLAMA32_1B.hidden_size),
        llm=LLAMA32_1B,
        description="675M-class windowed ViT + 16-layer 1B decoder (hidden 2048), Qwen2 vocabulary",
    ),
    "qwen25vl-llama3-3b": ModelArch(
        name="qwen25vl-llama3-3b",
        vision=_qwen25_vit(LLAMA32_3B.hidden_size),
        llm=LLAMA32_3B,
        description="675M-class windowed ViT + 28-layer 3B decoder (hidden 3072), Qwen2 vocabulary",
    ),
    "qwen25vl-fullatt-llama3-1b": ModelArch(
        name="qwen25vl-fullatt-llama3-1b",
        vision=_qwen25_vit(LLAMA32_1B.hidden_size, fullatt_block_indexes=tuple(range(32))),
        llm=LLAMA32_1B,
        description="675M-class ViT with full attention in all 32 blocks (the 'Qwen2Vision' of paper "
        "Fig. 4) + 16-layer 1B decoder (hidden 2048), Qwen2 vocabulary",
    ),
}


def get_arch(name: str) -> ModelArch:
    """The preset named ``name``; ConfigError listing the presets otherwise."""
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; choose from {', '.join(MODEL_PRESETS)}") from None
