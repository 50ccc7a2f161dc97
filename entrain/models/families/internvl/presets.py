"""InternVL shapes for ``plan`` / ``simulate`` (torch-free): published configurations, no weights."""

from __future__ import annotations

from entrain.core.model.architectures import LLMArch
from entrain.models.families.internvl.processing import InternVLRules
from entrain.models.families.internvl.spec import InternViTArch, InternVLShape

__all__ = ["PRESETS", "INTERNVIT_300M", "QWEN3_8B"]

INTERNVIT_300M = InternViTArch(num_layers=24, hidden_size=1024, intermediate_size=4096, num_heads=16)
"""``OpenGVLab/InternViT-300M-448px``'s ``config.json`` (InternVL3.5-8B's vision tower): 24 layers, hidden
1024, MLP 4096, 16 heads, image 448, patch 14, ``qkv_bias`` true, ``qk_normalization`` false,
``norm_type`` layer_norm (https://huggingface.co/OpenGVLab/InternViT-300M-448px/blob/main/config.json)."""

QWEN3_8B = LLMArch(
    num_hidden_layers=36,
    hidden_size=4096,
    intermediate_size=12288,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151_936,
    tie_word_embeddings=False,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=40_960,
)
"""``OpenGVLab/InternVL3_5-8B``'s ``llm_config`` (Qwen3-8B): 36 layers, hidden 4096, MLP 12288, 32 heads,
8 KV heads, head_dim 128, vocabulary 151936, no attention bias, rope_theta 1e6; ``downsample_ratio``
0.5, ``force_image_size`` 448, ``min_dynamic_patch`` 1, ``max_dynamic_patch`` 12
(https://huggingface.co/OpenGVLab/InternVL3_5-8B/blob/main/config.json)."""

PRESETS = {
    "internvl35-8b": InternVLShape(
        "internvl35-8b",
        INTERNVIT_300M,
        QWEN3_8B,
        InternVLRules(tile_px=448, patch_px=14, downsample_ratio=0.5, min_tiles=1, max_tiles=12),
        qk_norm=True,
        description="InternVL3.5-8B's published shape (InternViT-300M 448-px tiles + Qwen3-8B), cost model only",
    ),
}
