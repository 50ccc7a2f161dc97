"""Model presets: Hugging Face configs of the vision tower and the LLM, and their layer lists.

Layer lists are the cost model's (``entrain.core.costs.costmodel``): the encoder is
``[patch_embed, blocks.0 .. blocks.{depth-1}, merger]`` and the LLM is
``[embed_tokens, layers.0 .. layers.{L-1}, norm, lm_head, loss]``. A stage owns a half-open range
``[first, end)`` of one list (``entrain.core.ir.plan.StageSpec``).

Vocabulary: the paper-scale presets use the Qwen2 tokenizer's 151,936 ids. ``tiny`` keeps at most
4,096 ids through ``tiny_token_id`` (documented there).
"""

from __future__ import annotations

from dataclasses import dataclass

from entrain.core.errors import ConfigError
from entrain.core.model.architectures import MODEL_PRESETS, LLMArch, ModelArch, VisionArch, get_arch

__all__ = [
    "FAMILY",
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

FAMILY = "composition"
"""This family's registry name (``entrain.models.families.composition.family``)."""

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
class VLMConfig:
    """One model preset: its architecture (``entrain.core.model.architectures``, the single source of the
    dimensions the cost model also uses) plus how token ids are mapped.

    Tied embeddings (Llama-3.2) are built untied, initialised equal: the token embedding and the
    lm_head may live on different pipeline stages.
    """

    arch: ModelArch
    tiny_vocab: bool = False
    """True: token ids go through ``tiny_token_id``."""
    vision_dir: str | None = None
    """A stock Qwen2-VL / Qwen2.5-VL checkpoint folder (``entrain.models.families.composition.hf_checkpoint``)."""
    llm_dir: str | None = None
    """A stock causal-LM checkpoint folder."""
    special_ids: tuple[tuple[int, int], ...] = ()
    """Stock tokenizer: (Qwen2 special id, this model's id) pairs, e.g. ``<|image_pad|>``. A regular
    id (below 151,643; the renderer's synthetic text uses ids below 4,000) is taken modulo the
    smallest mapped special id, so it stays a regular id of a small vocabulary too."""

    family = FAMILY
    """The model family (``ModelFamily.runtime_config``'s contract)."""

    @property
    def is_stock(self) -> bool:
        return self.vision_dir is not None

    @property
    def shape(self) -> ModelArch:
        return self.arch

    @property
    def name(self) -> str:
        return self.arch.name

    @property
    def vision(self) -> VisionArch:
        return self.arch.vision

    @property
    def llm(self) -> LLMArch:
        return self.arch.llm

    def token_id(self, qwen_id: int) -> int:
        if self.tiny_vocab:
            return tiny_token_id(qwen_id)
        if self.special_ids and qwen_id >= QWEN2_SPECIAL_BASE:
            mapped = dict(self.special_ids).get(qwen_id)
            if mapped is None:
                raise ConfigError(f"the model's tokenizer has no token for Qwen2 special id {qwen_id}")
            return mapped
        if self.special_ids:
            return qwen_id % min(v for _, v in self.special_ids)
        return qwen_id

    @property
    def encoder_layer_names(self) -> list[str]:
        return ["patch_embed", *(f"blocks.{i}" for i in range(self.vision.depth)), "merger"]

    @property
    def llm_layer_names(self) -> list[str]:
        n = self.llm.num_hidden_layers
        return ["embed_tokens", *(f"layers.{i}" for i in range(n)), "norm", "lm_head", "loss"]

    def layer_names(self, component: str) -> list[str]:
        if component == "encoder":
            return self.encoder_layer_names
        if component == "llm":
            return self.llm_layer_names
        raise ConfigError(f"unknown component {component!r}; expected 'encoder' or 'llm'")


MODEL_NAMES = tuple(MODEL_PRESETS)


def get_model_config(name: str) -> VLMConfig:
    """The preset ``name`` (``tiny``, ``qwen25vl-llama3-1b``, ``qwen25vl-llama3-3b``)."""
    arch = get_arch(name)
    tiny = arch.llm.vocab_size <= TINY_VOCAB_SIZE
    return VLMConfig(arch=arch, tiny_vocab=tiny)
