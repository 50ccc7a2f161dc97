"""Tiny whole Qwen3-VL checkpoints (``save_pretrained``, random weights) and packed samples for them:
text, images wrapped in <|vision_start|> ... <|vision_end|>, labels."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.models import qwen_vl_tiny
from tests.models.qwen_vl_tiny import IMAGE, VEND, VIDEO, VOCAB, VSTART, Sample

__all__ = [
    "IMAGE",
    "VEND",
    "VIDEO",
    "VSTART",
    "Sample",
    "config",
    "save_whole",
    "save_with_tokenizer",
    "make_sample",
    "mixed_samples",
]

PATCH_VALUES = 3 * 2 * 16 * 16
TAPS = (0, 2, 3)
"""The tapped vision blocks of the tiny tower (DeepStack): 3 features into LLM layers 0, 1, 2."""


def config(*, text_layers: int = 4, vision_depth: int = 5, taps=TAPS, vocab: int = VOCAB, tied: bool = False,
           ids: dict | None = None):  # fmt: skip
    from transformers import Qwen3VLConfig

    text = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=text_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=vocab,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
            "mrope_interleaved": True,
        },  # fmt: skip
        bos_token_id=0,
        eos_token_id=1,
    )
    vision = dict(depth=vision_depth, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                  num_position_embeddings=16, deepstack_visual_indexes=list(taps))  # fmt: skip
    ids = ids or dict(
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VSTART, vision_end_token_id=VEND
    )
    return Qwen3VLConfig(vision_config=vision, text_config=text, tie_word_embeddings=tied, **ids)


def save_whole(folder: Path, *, seed: int = 0, shard: str | None = "200KB", **kwargs) -> Path:
    """A random ``Qwen3VLForConditionalGeneration`` saved to ``folder`` (sharded safetensors) with a
    Qwen3-VL ``preprocessor_config.json`` (16-px patches, merge 2)."""
    from transformers import Qwen3VLForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config(**kwargs))
    with torch.no_grad():  # non-trivial norms and biases, so a misplaced tensor shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    processor = {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16, "temporal_patch_size": 2,
                 "merge_size": 2, "size": {"shortest_edge": 4096, "longest_edge": 1048576},
                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=1) + "\n")
    return folder


def save_with_tokenizer(folder: Path, **kwargs) -> Path:
    """A tiny checkpoint as a published one ships: a tokenizer (small BPE + chat template) holding the
    vision tokens at the config's ids, the image processor config, and the model."""
    from transformers import AutoTokenizer

    from tests.models.qwen_vl_tiny import VISION_TOKENS
    from tests.models.stock import save_tokenizer

    save_tokenizer(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS.values())})
    tok.save_pretrained(folder)
    ids = {key: tok.convert_tokens_to_ids(t) for key, t in VISION_TOKENS.items()}
    return save_whole(folder, vocab=len(tok), ids=ids, **kwargs)


def make_sample(layout: list, seed: int) -> Sample:
    """``layout``: ints (that many text tokens) and ``(t, h, w)`` grids (one image each): the Qwen2-VL
    tiny sample's tokens (same ids) with 16-px patches (``[patches, 1536]``)."""
    sample = qwen_vl_tiny.make_sample(layout, seed)
    gen = torch.Generator().manual_seed(seed)
    sample.patches = torch.randn(sample.patches.shape[0], PATCH_VALUES, generator=gen)
    return sample


def mixed_samples() -> list[Sample]:
    """Two images of different sizes, text only, one wide image: what the tests pack."""
    return [
        make_sample([5, (1, 4, 6), 3, (1, 8, 4), 7], seed=1),
        make_sample([11], seed=2),
        make_sample([(1, 6, 6), 9], seed=3),
        make_sample([4, (1, 2, 2), 6], seed=4),
    ]
