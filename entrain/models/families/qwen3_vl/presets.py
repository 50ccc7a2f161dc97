"""Cost-model presets of the ``qwen3_vl`` family (torch-free): published shapes as plain numbers for
``plan`` / ``simulate`` with ``--model NAME``; training needs the checkpoint (``--model-path DIR``)."""

from __future__ import annotations

from entrain.models.families.qwen3_vl.spec import Qwen3VLShape, shape_of_config

__all__ = ["PRESETS", "QWEN3_VL_8B"]

QWEN3_VL_8B_CONFIG = {
    "model_type": "qwen3_vl",
    "tie_word_embeddings": False,
    "vision_config": {
        "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 4096,
        "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [8, 16, 24], "hidden_act": "gelu_pytorch_tanh",
    },
    "text_config": {
        "num_hidden_layers": 36, "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000, "mrope_section": [24, 20, 20],
                            "mrope_interleaved": True},
    },
}  # fmt: skip
"""The shape fields of ``Qwen/Qwen3-VL-8B-Instruct``'s ``config.json``
(https://huggingface.co/Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json): a 27-block 1152-wide ViT
(16-px patches, 2304-entry position table, DeepStack taps after blocks 8/16/24) merging to 4096, and
a Qwen3 decoder of 36 layers, hidden 4096, MLP 12288, 32 query / 8 KV heads of 128, vocabulary
151936, untied lm_head, rope_theta 5e6 with interleaved M-RoPE sections 24/20/20."""

QWEN3_VL_8B: Qwen3VLShape = shape_of_config(
    QWEN3_VL_8B_CONFIG, "preset qwen3vl-8b", "qwen3vl-8b", {"min_pixels": 65536, "max_pixels": 16777216}
)

PRESETS: dict[str, Qwen3VLShape] = {QWEN3_VL_8B.name: QWEN3_VL_8B}
