"""Tiny stock Hugging Face checkpoints made with ``save_pretrained`` (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch

HIDDEN = 64


def save_vision(
    folder: Path, *, family: str = "qwen2_5_vl", whole: bool = False, out_hidden: int = HIDDEN
) -> Path:
    """A 2-block vision tower: vision-only, or inside a whole ``...ForConditionalGeneration``."""
    torch.manual_seed(1)
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

        vc = Qwen2VLVisionConfig(depth=2, embed_dim=32, hidden_size=out_hidden, num_heads=2, mlp_ratio=2)
        whole_cls, whole_cfg, vision_cls = (
            Qwen2VLForConditionalGeneration,
            Qwen2VLConfig,
            Qwen2VisionTransformerPretrainedModel,
        )
    else:
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
            Qwen2_5_VisionTransformerPretrainedModel,
        )

        vc = Qwen2_5_VLVisionConfig(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=out_hidden,
            fullatt_block_indexes=[1],
        )
        whole_cls, whole_cfg, vision_cls = (
            Qwen2_5_VLForConditionalGeneration,
            Qwen2_5_VLConfig,
            Qwen2_5_VisionTransformerPretrainedModel,
        )
    if whole:
        text = dict(
            hidden_size=out_hidden,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=320,
            bos_token_id=0,
            eos_token_id=1,
        )
        model = whole_cls(whole_cfg(vision_config=vc.to_dict(), text_config=text))
    else:
        model = vision_cls(vc)
    with torch.no_grad():  # non-trivial norms, so a wrongly placed tensor shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(folder, max_shard_size="40KB")
    return folder


def save_llm(
    folder: Path, *, family: str = "llama", vocab: int = 300, tied: bool = True, hidden: int = HIDDEN
) -> Path:
    """A 2-layer causal LM (sharded safetensors)."""
    torch.manual_seed(2)
    common = dict(
        hidden_size=hidden,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=None,
    )
    if family == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**common))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(folder, max_shard_size="40KB")
    return folder


CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|start|>assistant\n{% generation %}{{ m['content'] }}</s>{% endgeneration %}"
    "{% else %}<|start|>{{ m['role'] }}\n{{ m['content'] }}</s>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)


def save_tokenizer(folder: Path, *, chat_template: bool = True) -> Path:
    """A small byte-level BPE tokenizer trained here (about 290 ids), with a chat template whose
    assistant parts are marked for ``return_assistant_tokens_mask``; no image tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [
        "What is shown in the chart? The bars rise from left to right.",
        "Describe the image. A cat sits on a red mat next to a window.",
        "How many apples are there? There are three apples on the table.",
    ] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=290,
        special_tokens=["<s>", "</s>", "<|start|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return folder
