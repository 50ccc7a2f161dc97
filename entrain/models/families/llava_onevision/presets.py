"""LLaVA-OneVision shapes (torch-free): LLaVA-OneVision-7B's published configuration and a tiny model
for CPU tests and profiling (``--model llava-ov-*``; the tiny one trains from a seed)."""

from __future__ import annotations

from entrain.core.model.architectures import LLMArch
from entrain.models.families.llava_onevision.processing import OneVisionRules
from entrain.models.families.llava_onevision.spec import OneVisionShape, SiglipArch

__all__ = ["PRESETS", "QWEN2_7B", "SIGLIP_SO400M"]

QWEN2_7B = LLMArch(
    num_hidden_layers=28,
    hidden_size=3584,
    intermediate_size=18944,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152_128,
    tie_word_embeddings=False,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=32_768,
    qkv_bias=True,
)
"""``llava-hf/llava-onevision-qwen2-7b-ov-hf``'s text_config (Qwen2-7B, vocabulary grown for the
``<image>`` / ``<video>`` tokens)."""

SIGLIP_SO400M = SiglipArch(num_layers=26, hidden_size=1152, intermediate_size=4304, num_heads=16)
"""SigLIP-so400m-patch14-384 as LLaVA-OneVision uses it (its last layer dropped: 26 layers)."""

PRESETS = {
    "llava-ov-7b": OneVisionShape(
        "llava-ov-7b",
        SIGLIP_SO400M,
        QWEN2_7B,
        description="LLaVA-OneVision-7B: SigLIP-so400m tiles + Qwen2-7B",
    ),
    "llava-ov-tiny": OneVisionShape(
        "llava-ov-tiny",
        SiglipArch(
            num_layers=2, hidden_size=32, intermediate_size=64, num_heads=4, image_size=28, patch_size=7
        ),
        LLMArch(
            num_hidden_layers=2,
            hidden_size=48,
            intermediate_size=96,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=200,
            tie_word_embeddings=False,
            qkv_bias=True,
        ),  # fmt: skip
        OneVisionRules(
            tile_px=28, patch_px=7, grid_pinpoints=((28, 28), (28, 56), (56, 28), (56, 56)), max_tiles=4
        ),
        description="a tiny LLaVA-OneVision for CPU tests and profiling",
    ),
}
