"""Tiny whole Qwen3-VL-MoE checkpoints (``save_pretrained``, random weights): Qwen3-VL's tiny tower and
a 4-layer decoder of 4 experts (top 2), layer 0 dense (``mlp_only_layers``), the auxiliary loss on
with a coefficient large enough that a wrong auxiliary term shows in every router's gradient."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.models.qwen_vl_tiny import IMAGE, VEND, VIDEO, VOCAB, VSTART

__all__ = ["config", "save_whole", "TAPS"]

TAPS = (0, 1)
"""The tapped vision blocks of the 2-block tower: DeepStack features into LLM layers 0 and 1."""


def config(*, text_layers: int = 4, vision_depth: int = 2, taps=TAPS, experts: int = 4, top_k: int = 2,
           mlp_only=(0,), sparse_step: int = 1, aux: bool = True, coef: float = 0.3):  # fmt: skip
    from transformers import Qwen3VLMoeConfig

    text = dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=experts,
        num_experts_per_tok=top_k, mlp_only_layers=list(mlp_only), decoder_sparse_step=sparse_step,
        output_router_logits=aux, router_aux_loss_coef=coef, num_hidden_layers=text_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                         "mrope_interleaved": True},
        bos_token_id=0, eos_token_id=1,
    )  # fmt: skip
    vision = dict(depth=vision_depth, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                  num_position_embeddings=16, deepstack_visual_indexes=list(taps))  # fmt: skip
    ids = dict(
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VSTART, vision_end_token_id=VEND
    )
    return Qwen3VLMoeConfig(vision_config=vision, text_config=text, tie_word_embeddings=False, **ids)


def save_whole(folder: Path, *, seed: int = 0, **kwargs) -> Path:
    """A random ``Qwen3VLMoeForConditionalGeneration`` saved to ``folder`` with a Qwen3-VL
    ``preprocessor_config.json``; routers spread (std 1) so no token's top-k is a near tie."""
    from transformers import Qwen3VLMoeForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3VLMoeForConditionalGeneration(config(**kwargs))
    with torch.no_grad():  # non-trivial norms and biases, so a misplaced tensor shows
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (1.0 if name.endswith("mlp.gate.weight") else 0.02))
    model.save_pretrained(folder)
    processor = {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16, "temporal_patch_size": 2,
                 "merge_size": 2, "size": {"shortest_edge": 4096, "longest_edge": 1048576},
                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=1) + "\n")
    return folder


if __name__ == "__main__":  # python -m tests.models.qwen3_vl_moe_tiny DIR: the checkpoint benchmarks train
    import sys

    print(save_whole(Path(sys.argv[1])))
