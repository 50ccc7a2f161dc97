"""LLaVA-OneVision's chat formatting (torch-free), as transformers' ``LlavaOnevisionProcessor`` builds
a prompt: the conversation through the tokenizer's chat template (Qwen2's chat markers when it has
none: ``entrain.data.processing.format_chat``), each ``<image>`` placeholder replaced by ``n``
``<image>`` tokens, ``n`` the image's LLM tokens (``LlavaOnevisionProcessor.replace_image_token``;
no start/end markers). Labels copy each assistant turn's ids (``format_chat``'s rule).

A tokenizer without an ``<image>`` special token (Entrain's built-in Qwen2 tokenizer) writes Qwen2's
``<|image_pad|>`` instead, which ``image_token_of`` says the family maps onto the model's image id."""

from __future__ import annotations

from collections.abc import Sequence

from entrain.data.processing import IMAGE_PAD, format_chat
from entrain.data.tokenizer import TextTokenizer

__all__ = ["IMAGE_TOKEN", "chat_ids", "image_token_of"]

IMAGE_TOKEN = "<image>"
"""``LlavaOnevisionProcessor.image_token``: one per LLM token of an image."""


def image_token_of(tokenizer: TextTokenizer) -> str:
    """The image token ``tokenizer`` has: ``<image>``, else Qwen2's ``<|image_pad|>``."""
    return IMAGE_TOKEN if IMAGE_TOKEN in tokenizer.special_tokens else IMAGE_PAD


def chat_ids(
    turns: Sequence[tuple[str, str]], image_tokens: Sequence[int], tokenizer: TextTokenizer
) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of a conversation whose i-th ``<image>`` has ``image_tokens[i]`` LLM
    tokens. ValueError when the placeholder count differs from ``len(image_tokens)``."""
    token = image_token_of(tokenizer)
    return format_chat(turns, image_tokens, tokenizer, lambda n: token * n)
