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


def _varlen_available(query: torch.Tensor) -> bool:
    """Flash varlen attention (``torch.nn.attention.varlen``) runs on CUDA in half precision."""
    if not query.is_cuda or query.dtype not in (torch.float16, torch.bfloat16):
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def _varlen(query, key, value, lens: list[int], scaling) -> torch.Tensor:
    """All packed samples in one causal varlen kernel; returns ``[1, T, heads, D]``."""
    from torch.nn.attention.varlen import varlen_attn

    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    cu = torch.tensor(offsets, dtype=torch.int32).pin_memory().to(query.device, non_blocking=True)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, heads, D]
    out = varlen_attn(
        q,
        k,
        v,
        cu,
        cu,
        max(lens),
        max(lens),
        scale=scaling,
        window_size=(-1, 0),
        enable_gqa=k.shape[1] != q.shape[1],
    )
    return out.unsqueeze(0)


def packed_causal_attention(module, query, key, value, attention_mask, **kwargs):
    """``query``/``key``/``value``: ``[B, heads, T, D]``; returns ``([B, T, heads, D], None)``.
    On a GPU in half precision one varlen (flash) kernel covers every packed sample; elsewhere (the
    CPU) each sample runs its own causal SDPA call."""
    seq_lens = kwargs.pop("entrain_seq_lens", None)
    if seq_lens is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("is_causal", None)
    lens = list(seq_lens)
    if query.shape[0] == 1 and _varlen_available(query):
        return _varlen(query, key, value, lens, kwargs.get("scaling")), None
    outs = [
        sdpa_attention_forward(module, q, k, v, None, is_causal=True, **kwargs)[0]
        for q, k, v in zip(query.split(lens, 2), key.split(lens, 2), value.split(lens, 2))
    ]
    return torch.cat(outs, dim=1), None


AttentionInterface.register(PACKED_ATTENTION, packed_causal_attention)
