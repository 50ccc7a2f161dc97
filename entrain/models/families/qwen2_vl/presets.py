"""Cost-model presets of the ``qwen2_vl`` family (torch-free): published shapes as plain numbers, for
``plan`` / ``simulate`` / ``data stats`` with ``--model NAME`` (no checkpoint folder, no weights).

Training a preset needs the checkpoint itself (``--model-path DIR``): the family builds transformers'
model from the folder's ``config.json`` and tensors.
"""

from __future__ import annotations

from entrain.core.model.architectures import LLMArch, ModelArch, VisionArch

__all__ = ["PRESETS", "QWEN25_VL_7B"]

QWEN25_VL_7B = ModelArch(
    name="qwen25vl-7b",
    vision=VisionArch(
        depth=32,
        hidden_size=1280,
        intermediate_size=3420,
        num_heads=16,
        out_hidden_size=3584,
        fullatt_block_indexes=(7, 15, 23, 31),
        window_size=112,
        patch_size=14,
        temporal_patch_size=2,
        spatial_merge_size=2,
    ),
    llm=LLMArch(
        num_hidden_layers=28,
        hidden_size=3584,
        intermediate_size=18944,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152_064,
        tie_word_embeddings=False,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=128_000,
        qkv_bias=True,
    ),
    description="Qwen2.5-VL-7B-Instruct's published shape (vision tower 32 x 1280 + Qwen2 28 x 3584), cost model only",
)
"""``Qwen/Qwen2.5-VL-7B-Instruct``'s ``config.json``: the vision tower (depth 32, hidden 1280, MLP 3420,
16 heads, full attention in blocks 7/15/23/31, 112-px windows, merger to 3584) and the Qwen2 language
model (28 layers, hidden 3584, MLP 18944, 28 heads, 4 KV heads, vocabulary 152064, untied lm_head)."""

PRESETS: dict[str, ModelArch] = {QWEN25_VL_7B.name: QWEN25_VL_7B}
