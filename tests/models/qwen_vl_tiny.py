"""Tiny whole Qwen2-VL / Qwen2.5-VL checkpoints (``save_pretrained``, random weights) and packed
batches for them: text, images wrapped in <|vision_start|> ... <|vision_end|>, labels."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

VOCAB = 256
IMAGE, VIDEO, VSTART, VEND = 250, 251, 252, 253
PATCH_VALUES = 3 * 2 * 14 * 14
FAMILIES = ("qwen2_vl", "qwen2_5_vl")


def _configs(family: str, *, text_layers: int, vision_depth: int, tied: bool, vocab: int = VOCAB, ids=None,
             kv_heads: int = 2):  # fmt: skip
    text = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=text_layers,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        bos_token_id=0,
        eos_token_id=1,
    )
    ids = ids or dict(
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VSTART, vision_end_token_id=VEND
    )
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

        vision = dict(depth=vision_depth, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2)
        cfg = Qwen2VLConfig(vision_config=vision, text_config=text, tie_word_embeddings=tied, **ids)
        return cfg, Qwen2VLForConditionalGeneration
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    vision = dict(
        depth=vision_depth,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        fullatt_block_indexes=[1, vision_depth - 1],
        window_size=56,  # 2x2 merged tokens per window: several windows per image
    )
    cfg = Qwen2_5_VLConfig(vision_config=vision, text_config=text, tie_word_embeddings=tied, **ids)
    return cfg, Qwen2_5_VLForConditionalGeneration


def save_whole(folder: Path, family: str, *, text_layers: int = 4, vision_depth: int = 4, tied: bool = False,
               seed: int = 0, shard: str | None = "200KB", vocab: int = VOCAB, ids: dict | None = None,
               kv_heads: int = 2) -> Path:  # fmt: skip
    """A random ``...ForConditionalGeneration`` saved to ``folder`` (sharded safetensors; 4 query heads,
    ``kv_heads`` KV heads)."""
    torch.manual_seed(seed)
    cfg, cls = _configs(
        family, text_layers=text_layers, vision_depth=vision_depth, tied=tied, vocab=vocab, ids=ids,
        kv_heads=kv_heads,
    )  # fmt: skip
    model = cls(cfg)
    with torch.no_grad():  # non-trivial norms and biases, so a misplaced tensor shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(folder, **kwargs)
    return folder


VISION_TOKENS = {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
                 "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"}  # fmt: skip


def save_with_tokenizer(folder: Path, family: str = "qwen2_5_vl", **kwargs) -> Path:
    """A tiny checkpoint as a published one ships: a tokenizer (small BPE + chat template) holding the
    vision tokens at the config's ids, an image processor config, and the model."""
    import json

    from transformers import AutoTokenizer

    from tests.models.stock import save_tokenizer

    save_tokenizer(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS.values())})
    tok.save_pretrained(folder)
    ids = {key: tok.convert_tokens_to_ids(t) for key, t in VISION_TOKENS.items()}
    processor = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "temporal_patch_size": 2,
                 "merge_size": 2, "min_pixels": 3136, "max_pixels": 12845056}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=1) + "\n")
    return save_whole(folder, family, vocab=len(tok), ids=ids, **kwargs)


@dataclass
class Sample:
    input_ids: torch.Tensor
    image_positions: torch.Tensor
    grids: tuple[tuple[int, int, int], ...]
    patches: torch.Tensor
    """``[patches, 1176]`` of its images, in order."""

    @property
    def label_positions(self) -> torch.Tensor:
        return torch.arange(self.input_ids.numel() - 1)

    @property
    def targets(self) -> torch.Tensor:
        return self.input_ids[1:]


def make_sample(layout: list, seed: int) -> Sample:
    """``layout``: ints (that many text tokens) and ``(t, h, w)`` grids (one image each)."""
    gen = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    positions: list[int] = []
    grids, patches = [], []
    for part in layout:
        if isinstance(part, int):
            ids += torch.randint(2, 240, (part,), generator=gen).tolist()
            continue
        t, h, w = part
        ids.append(VSTART)
        positions += range(len(ids), len(ids) + t * h * w // 4)
        ids += [IMAGE] * (t * h * w // 4)
        ids.append(VEND)
        grids.append(tuple(part))
        patches.append(torch.randn(t * h * w, PATCH_VALUES, generator=gen))
    return Sample(
        torch.tensor(ids),
        torch.tensor(positions, dtype=torch.int64),
        tuple(grids),
        torch.cat(patches) if patches else torch.zeros(0, PATCH_VALUES),
    )


def mixed_samples() -> list[Sample]:
    """Two images of different sizes, text only, one wide image, text only: what the tests pack."""
    return [
        make_sample([5, (1, 4, 6), 3, (1, 8, 4), 7], seed=1),
        make_sample([11], seed=2),
        make_sample([(1, 6, 6), 9], seed=3),
        make_sample([4, (1, 2, 2), 6], seed=4),
    ]
