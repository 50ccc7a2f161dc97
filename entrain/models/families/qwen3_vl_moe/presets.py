"""Cost-model presets of the ``qwen3_vl_moe`` family (torch-free): published shapes as plain numbers for
``plan`` / ``simulate`` with ``--model NAME``; training needs the checkpoint (``--model-path DIR``)."""

from __future__ import annotations

from entrain.models.families.qwen3_vl_moe.spec import Qwen3VLMoeShape, shape_of_config

__all__ = ["PRESETS", "QWEN3_VL_30B_A3B"]

QWEN3_VL_30B_A3B_CONFIG = {
    "model_type": "qwen3_vl_moe",
    "tie_word_embeddings": False,
    "vision_config": {
        "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 2048,
        "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [8, 16, 24], "hidden_act": "gelu_pytorch_tanh",
    },
    "text_config": {
        "num_hidden_layers": 48, "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "router_aux_loss_coef": 0.001,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000, "mrope_section": [24, 20, 20],
                            "mrope_interleaved": True},
    },
}  # fmt: skip
"""The shape fields of ``Qwen/Qwen3-VL-30B-A3B-Instruct``'s ``config.json``
(https://huggingface.co/Qwen/Qwen3-VL-30B-A3B-Instruct/blob/main/config.json): Qwen3-VL-8B's tower
(27 blocks of 1152, 16-px patches, DeepStack taps after blocks 8/16/24) merging to 2048, and a
Qwen3-MoE decoder of 48 layers, hidden 2048, 32 query / 4 KV heads of 128, every layer sparse: 128
experts of width 768, 8 per token; vocabulary 151936, untied lm_head, rope_theta 5e6 with
interleaved M-RoPE sections 24/20/20. The checkpoint leaves ``output_router_logits`` off, so
transformers' loss has no auxiliary term unless a run turns it on."""

QWEN3_VL_30B_A3B: Qwen3VLMoeShape = shape_of_config(
    QWEN3_VL_30B_A3B_CONFIG, "preset qwen3vl-30b-a3b", "qwen3vl-30b-a3b",
    {"min_pixels": 65536, "max_pixels": 16777216},
)  # fmt: skip

PRESETS: dict[str, Qwen3VLMoeShape] = {QWEN3_VL_30B_A3B.name: QWEN3_VL_30B_A3B}
