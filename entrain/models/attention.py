"""Packed causal attention for the LLM: samples concatenated along the sequence never attend to each
other. Registered in transformers' ``AttentionInterface`` as ``entrain_packed``; the per-sample
lengths travel as the ``entrain_seq_lens`` keyword through ``LlamaDecoderLayer``. Without it the
function is plain SDPA (what an unpacked single sample uses)."""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

__all__ = ["PACKED_ATTENTION", "packed_causal_attention"]

PACKED_ATTENTION = "entrain_packed"


def packed_causal_attention(module, query, key, value, attention_mask, **kwargs):
    """``query``/``key``/``value``: ``[B, heads, T, D]``; returns ``([B, T, heads, D], None)``."""
    seq_lens = kwargs.pop("entrain_seq_lens", None)
    if seq_lens is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("is_causal", None)
    lens = list(seq_lens)
    outs = [
        sdpa_attention_forward(module, q, k, v, None, is_causal=True, **kwargs)[0]
        for q, k, v in zip(query.split(lens, 2), key.split(lens, 2), value.split(lens, 2))
    ]
    return torch.cat(outs, dim=1), None


AttentionInterface.register(PACKED_ATTENTION, packed_causal_attention)
