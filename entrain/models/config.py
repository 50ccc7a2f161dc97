"""Model presets: Hugging Face configs of the vision tower and the LLM, and their layer lists.

Layer lists are the cost model's (``entrain.core.costmodel``): the encoder is
``[patch_embed, blocks.0 .. blocks.{depth-1}, merger]`` and the LLM is
``[embed_tokens, layers.0 .. layers.{L-1}, norm, lm_head, loss]``. A stage owns a half-open range
``[first, end)`` of one list (``entrain.core.plan.StageSpec``).

Vocabulary: the paper-scale presets use the Qwen2 tokenizer's 151,936 ids. ``tiny`` keeps at most
4,096 ids through ``tiny_token_id`` (documented there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from entrain.core.errors import ConfigError

__all__ = [
    "VisionDims",
    "LLMDims",
    "VLMConfig",
    "QWEN2_VOCAB_SIZE",
    "QWEN2_SPECIAL_BASE",
    "TINY_VOCAB_SIZE",
    "TINY_SPECIAL_BASE",
    "IMAGE_PAD_ID",
    "VISION_START_ID",
    "VISION_END_ID",
    "ENDOFTEXT_ID",
    "tiny_token_id",
    "get_model_config",
    "MODEL_NAMES",
]

QWEN2_VOCAB_SIZE = 151_936
QWEN2_SPECIAL_BASE = 151_643
"""First special id of the Qwen2 tokenizer (``<|endoftext|>``); specials are ``151643..151664``."""
ENDOFTEXT_ID = 151_643
VISION_START_ID = 151_652
VISION_END_ID = 151_653
IMAGE_PAD_ID = 151_655

TINY_VOCAB_SIZE = 4_096
TINY_SPECIAL_BASE = TINY_VOCAB_SIZE - 32


def tiny_token_id(qwen_id: int) -> int:
    """Deterministic remap of a Qwen2 token id into the ``tiny`` vocabulary of 4,096 ids.

    Special ids (``>= 151643``) are pinned to ``4064 + (id - 151643)`` (so ``<|image_pad|>`` is 4076,
    ``<|vision_start|>`` 4073, ``<|vision_end|>`` 4074); every other id maps to ``id % 4064``.
    """
    if qwen_id < 0 or qwen_id >= QWEN2_VOCAB_SIZE:
        raise ValueError(f"token id {qwen_id} outside the Qwen2 vocabulary [0, {QWEN2_VOCAB_SIZE})")
    if qwen_id >= QWEN2_SPECIAL_BASE:
        return TINY_SPECIAL_BASE + (qwen_id - QWEN2_SPECIAL_BASE)
    return qwen_id % TINY_SPECIAL_BASE


@dataclass(frozen=True, kw_only=True, slots=True)
class VisionDims:
    """Qwen2.5-VL vision tower dimensions (``Qwen2_5_VLVisionConfig`` fields)."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    window_size: int = 112
    fullatt_block_indexes: tuple[int, ...] = ()
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    in_channels: int = 3

    @property
    def patch_dim(self) -> int:
        """Values per flattened patch row: ``C * T * P * P`` (1,176 for Qwen2.5-VL)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


@dataclass(frozen=True, kw_only=True, slots=True)
class LLMDims:
    """Llama decoder dimensions (``LlamaConfig`` fields)."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    head_dim: int | None = None
    rope_theta: float = 500_000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 131_072


@dataclass(frozen=True, kw_only=True, slots=True)
class VLMConfig:
    """One model preset: vision tower + LLM (the merger projects to the LLM width)."""

    name: str
    vision: VisionDims
    llm: LLMDims
    tiny_vocab: bool = False
    """True: token ids go through ``tiny_token_id``."""
    notes: dict = field(default_factory=dict, compare=False)

    def token_id(self, qwen_id: int) -> int:
        return tiny_token_id(qwen_id) if self.tiny_vocab else qwen_id

    @property
    def image_pad_id(self) -> int:
        return self.token_id(IMAGE_PAD_ID)

    @property
    def encoder_layer_names(self) -> list[str]:
        return ["patch_embed", *(f"blocks.{i}" for i in range(self.vision.depth)), "merger"]

    @property
    def llm_layer_names(self) -> list[str]:
        return [
            "embed_tokens",
            *(f"layers.{i}" for i in range(self.llm.num_layers)),
            "norm",
            "lm_head",
            "loss",
        ]

    def layer_names(self, component: str) -> list[str]:
        if component == "encoder":
            return self.encoder_layer_names
        if component == "llm":
            return self.llm_layer_names
        raise ConfigError(f"unknown component {component!r}; expected 'encoder' or 'llm'")


_QWEN25_VIT = VisionDims(
    depth=32,
    hidden_size=1280,
    intermediate_size=3420,
    num_heads=16,
    window_size=112,
    fullatt_block_indexes=(7, 15, 23, 31),
)

_PRESETS: dict[str, VLMConfig] = {
    "tiny": VLMConfig(
        name="tiny",
        vision=VisionDims(
            depth=2, hidden_size=128, intermediate_size=256, num_heads=4, fullatt_block_indexes=(1,)
        ),
        llm=LLMDims(
            num_layers=4,
            hidden_size=128,
            intermediate_size=256,
            num_heads=4,
            num_kv_heads=2,
            vocab_size=TINY_VOCAB_SIZE,
            max_position_embeddings=16_384,
        ),
        tiny_vocab=True,
    ),
    # Llama-3.2-1B / -3B decoders with the Qwen2 tokenizer's vocabulary (embeddings untied, so the
    # token embedding and lm_head can live on different pipeline stages).
    "qwen25vl-llama3-1b": VLMConfig(
        name="qwen25vl-llama3-1b",
        vision=_QWEN25_VIT,
        llm=LLMDims(
            num_layers=16,
            hidden_size=2048,
            intermediate_size=8192,
            num_heads=32,
            num_kv_heads=8,
            head_dim=64,
            vocab_size=QWEN2_VOCAB_SIZE,
        ),
    ),
    "qwen25vl-llama3-3b": VLMConfig(
        name="qwen25vl-llama3-3b",
        vision=_QWEN25_VIT,
        llm=LLMDims(
            num_layers=28,
            hidden_size=3072,
            intermediate_size=8192,
            num_heads=24,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=QWEN2_VOCAB_SIZE,
        ),
    ),
}
MODEL_NAMES = tuple(_PRESETS)


def get_model_config(name: str) -> VLMConfig:
    """The preset ``name`` (``tiny``, ``qwen25vl-llama3-1b``, ``qwen25vl-llama3-3b``)."""
    try:
        return _PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; choose from {', '.join(_PRESETS)}") from None
