"""A tiny whole InternVL checkpoint made with ``save_pretrained`` (nothing is downloaded): InternViT 2 x 32
on 56-px tiles at patch 7 (64 patches, 16 LLM tokens per tile after the pixel shuffle), a 2 x 32 Qwen2
or Qwen3 LLM, GotOcr2's image processor (1..4 tiles), and a small BPE tokenizer with ``<img>``,
``</img>``, ``<IMG_CONTEXT>`` and a chat template marking the assistant turns."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.models.stock import CHAT_TEMPLATE

TILE_PX, PATCH_PX, MAX_TILES = 56, 7, 4
SPECIALS = ["<s>", "</s>", "<|start|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"]


def save_tokenizer(folder: Path):
    """A byte-level BPE tokenizer (about 300 ids) with InternVL's image tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [
        "What is shown in the chart? The bars rise from left to right.",
        "Describe the image. A cat sits on a red mat next to a window.",
    ] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        extra_special_tokens={
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        },
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def config(vocab: int, image_token_id: int, *, text: str = "qwen2", tied: bool = True, layers: int = 2):
    """An ``InternVLConfig`` of the tiny shape."""
    from transformers import InternVLConfig

    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  image_size=TILE_PX, patch_size=PATCH_PX, attention_bias=True)  # fmt: skip
    llm = dict(model_type=text, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab, tie_word_embeddings=tied,
               bos_token_id=0, eos_token_id=1)  # fmt: skip
    if text == "qwen3":
        llm["head_dim"] = 8
    return InternVLConfig(vision_config=vision, text_config=llm, image_token_id=image_token_id,
                          image_seq_length=(TILE_PX // PATCH_PX // 2) ** 2, tie_word_embeddings=tied)  # fmt: skip


def save_internvl(folder: Path, *, text: str = "qwen2", tied: bool = True, seed: int = 0) -> Path:
    """The tiny checkpoint under ``folder`` (weights perturbed so a misplaced tensor shows)."""
    from transformers import InternVLForConditionalGeneration
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    folder = Path(folder)
    tok = save_tokenizer(folder)
    torch.manual_seed(seed)
    model = InternVLForConditionalGeneration(
        config(len(tok), tok.convert_tokens_to_ids("<IMG_CONTEXT>"), text=text, tied=tied)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    GotOcr2ImageProcessorPil(
        size={"height": TILE_PX, "width": TILE_PX}, min_patches=1, max_patches=MAX_TILES,
        image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225],
    ).save_pretrained(folder)  # fmt: skip
    return folder
