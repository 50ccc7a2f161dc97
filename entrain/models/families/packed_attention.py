"""Attention of the model's packed sequences: one flash varlen kernel over every sequence on a suitable
GPU, one SDPA call per sequence elsewhere.

* The LLM's packed causal attention: samples concatenated along the sequence never attend to each
  other. Registered in transformers' ``AttentionInterface`` as ``entrain_packed``; the per-sample
  lengths travel as the ``entrain_seq_lens`` keyword through ``LlamaDecoderLayer``. Without it the
  function is plain SDPA (what an unpacked single sample uses).
* The vision tower's windows (Qwen2.5-VL window attention and its full-attention blocks; Qwen2-VL's
  per-image attention): registered as ``entrain_flash_windows``. Transformers' vision attention
  hands an implementation whose name contains "flash" the whole packed sequence with its window
  bounds (``cu_seq_lens_q``) in one call, instead of calling it once per window.

Which of the two paths runs is ``choose_attention_path``, a pure function of the device, dtypes,
head size, compute capability and autocast dtype, with the reason for its choice. The flash kernel
(``torch.nn.attention.varlen.varlen_attn``) needs q, k and v in one half dtype; under autocast
RoPE hands q and k over in float32 next to a bf16 v, so they are cast to the autocast dtype first
(what SDPA does under autocast).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

__all__ = [
    "PACKED_ATTENTION",
    "VISION_ATTENTION",
    "VARLEN",
    "PER_SEQUENCE_SDPA",
    "AttentionPath",
    "choose_attention_path",
    "attention_path",
    "packed_causal_attention",
    "windowed_vision_attention",
    "use_varlen_vision_attention",
]

PACKED_ATTENTION = "entrain_packed"
VISION_ATTENTION = "entrain_flash_windows"
"""The vision tower's attention implementation ("flash" in the name: transformers passes the window
bounds in one call; ``windowed_vision_attention`` still falls back to one SDPA call per window)."""

VARLEN = "varlen"
PER_SEQUENCE_SDPA = "per_sequence_sdpa"
HALF_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MIN_CAPABILITY = (8, 0)
FLASH_MAX_CAPABILITY = (12, 1)
"""torch's flash kernels run on sm80 to sm121 (``check_flash_attention_hardware_support``)."""
FLASH_MAX_HEAD_DIM = 256
FLASH_NO_BACKWARD_HEAD_DIMS = range(193, 225)
"""Head sizes whose flash backward fails on sm86-sm89 and sm120-sm121 (torch's
``check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120``)."""
_CONSUMER_CAPABILITIES = ((8, 6), (8, 7), (8, 8), (8, 9), (12, 0), (12, 1))


@dataclass(frozen=True, slots=True)
class AttentionPath:
    name: str
    """``VARLEN`` (one flash kernel over every sequence) or ``PER_SEQUENCE_SDPA``."""
    reason: str
    dtype: torch.dtype | None = None
    """The dtype q, k and v enter the varlen kernel in (None on the SDPA path)."""


def _sm(capability: tuple[int, int]) -> str:
    return f"sm{capability[0]}{capability[1]}"


def _kernel_dtype(dtypes: Sequence[torch.dtype], autocast_dtype: torch.dtype | None) -> torch.dtype:
    """The autocast dtype when autocast is on, else the dtype all of q, k, v promote to."""
    if autocast_dtype is not None:
        return autocast_dtype
    common = dtypes[0]
    for d in dtypes[1:]:
        common = torch.promote_types(common, d)
    return common


def choose_attention_path(
    *,
    device_type: str,
    dtypes: Sequence[torch.dtype],
    head_dim: int,
    capability: tuple[int, int] | None,
    autocast_dtype: torch.dtype | None = None,
    needs_grad: bool = True,
    kernel_available: bool = True,
    rows: int = 1,
    dropout: float = 0.0,
) -> AttentionPath:
    """The varlen path when every requirement of torch's flash kernel holds, else per-sequence SDPA;
    each with the reason. ``dtypes``: of q, k, v; ``capability``: the CUDA device's (major, minor);
    ``autocast_dtype``: the enabled autocast's dtype on ``device_type`` (None: autocast off);
    ``needs_grad``: a backward will run; ``rows``: the batch rows (the varlen path packs one);
    ``dropout``: the attention dropout (torch's varlen kernel runs none)."""

    def sdpa(reason: str) -> AttentionPath:
        return AttentionPath(PER_SEQUENCE_SDPA, reason)

    if not kernel_available:
        return sdpa("this torch has no torch.nn.attention.varlen")
    if device_type != "cuda":
        return sdpa(f"{device_type} device: the flash varlen kernel runs on CUDA only")
    if rows != 1:
        return sdpa(f"{rows} batch rows: the varlen path takes one packed row")
    if dropout:
        return sdpa(f"attention dropout {dropout:g}: the varlen kernel has none")
    if capability is None or not FLASH_MIN_CAPABILITY <= tuple(capability) <= FLASH_MAX_CAPABILITY:
        got = "unknown" if capability is None else _sm(capability)
        return sdpa(f"compute capability {got} outside the flash kernel's sm80-sm121")
    dtype = _kernel_dtype(dtypes, autocast_dtype)
    if dtype not in HALF_DTYPES:
        what = (
            f"autocast dtype {dtype}" if autocast_dtype is not None else f"q/k/v in {dtype} without autocast"
        )
        return sdpa(f"{what}: the flash kernel takes float16 or bfloat16")
    if head_dim > FLASH_MAX_HEAD_DIM:
        return sdpa(f"head size {head_dim} above the flash kernel's {FLASH_MAX_HEAD_DIM}")
    if needs_grad and head_dim in FLASH_NO_BACKWARD_HEAD_DIMS and tuple(capability) in _CONSUMER_CAPABILITIES:
        return sdpa(f"head size {head_dim}: no flash backward on {_sm(capability)} for 193-224")
    return AttentionPath(VARLEN, f"CUDA {_sm(capability)}, {dtype}, head size {head_dim}", dtype)


@cache
def _kernel_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def _device_facts(device: torch.device) -> tuple[str, tuple[int, int] | None]:
    """(device type, CUDA compute capability or None)."""
    if device.type != "cuda":
        return device.type, None
    return "cuda", _capability(torch.cuda.current_device() if device.index is None else device.index)


@cache
def _capability(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))


def attention_path(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float = 0.0
) -> AttentionPath:
    """``choose_attention_path`` for these tensors, the device they are on and its autocast state."""
    device_type, capability = _device_facts(query.device)
    autocast_on = torch.is_autocast_enabled(query.device.type)
    return choose_attention_path(
        device_type=device_type,
        dtypes=(query.dtype, key.dtype, value.dtype),
        head_dim=query.shape[-1],
        capability=capability,
        autocast_dtype=torch.get_autocast_dtype(query.device.type) if autocast_on else None,
        needs_grad=torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)),
        kernel_available=_kernel_available(),
        rows=query.shape[0],
        dropout=dropout,
    )


def _varlen_kernel(*args, **kwargs) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(*args, **kwargs)


def _offsets_on(offsets: torch.Tensor | Sequence[int], device: torch.device) -> torch.Tensor:
    """int32 sequence offsets on ``device`` (from pinned memory without a wait on a GPU)."""
    cu = torch.as_tensor(offsets, dtype=torch.int32)
    if cu.device == device:
        return cu
    if device.type == "cuda" and cu.device.type == "cpu":
        return cu.pin_memory().to(device, non_blocking=True)
    return cu.to(device)


def _varlen(query, key, value, path: AttentionPath, offsets, max_len: int, scaling, causal: bool):
    """Every sequence in one varlen kernel; ``query``/``key``/``value`` ``[1, heads, T, D]`` enter it in
    ``path.dtype``; returns ``[1, T, heads, D]``."""
    cu = _offsets_on(offsets, query.device)
    q, k, v = (t[0].transpose(0, 1).to(path.dtype) for t in (query, key, value))  # [T, heads, D]
    out = _varlen_kernel(
        q,
        k,
        v,
        cu,
        cu,
        max_len,
        max_len,
        scale=scaling,
        window_size=(-1, 0) if causal else (-1, -1),
        enable_gqa=k.shape[1] != q.shape[1],
    )
    return out.unsqueeze(0)


def _per_sequence_sdpa(module, query, key, value, lens: list[int], causal: bool, kwargs) -> torch.Tensor:
    """One SDPA call per sequence of ``lens`` (along dim 2 of ``[B, heads, T, D]``); returns ``[B, T, heads, D]``."""
    outs = [
        sdpa_attention_forward(module, q, k, v, None, is_causal=causal, **kwargs)[0]
        for q, k, v in zip(query.split(lens, 2), key.split(lens, 2), value.split(lens, 2))
    ]
    return torch.cat(outs, dim=1)


def packed_causal_attention(module, query, key, value, attention_mask, **kwargs):
    """``query``/``key``/``value``: ``[B, heads, T, D]``; returns ``([B, T, heads, D], None)``.
    One varlen (flash) kernel covers every packed sample where ``attention_path`` allows it; elsewhere
    (the CPU) each sample runs its own causal SDPA call."""
    seq_lens = kwargs.pop("entrain_seq_lens", None)
    if seq_lens is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("is_causal", None)
    lens = list(seq_lens)
    path = attention_path(query, key, value, kwargs.get("dropout", 0.0))
    if path.name == VARLEN:
        offsets = [0]
        for n in lens:
            offsets.append(offsets[-1] + n)
        return _varlen(query, key, value, path, offsets, max(lens), kwargs.get("scaling"), True), None
    return _per_sequence_sdpa(module, query, key, value, lens, True, kwargs), None


def windowed_vision_attention(module, query, key, value, attention_mask, **kwargs):
    """The vision tower's attention over the windows (or images) ``cu_seq_lens_q`` bounds:
    ``query``/``key``/``value`` ``[1, heads, N, D]``; returns ``([1, N, heads, D], None)``. One varlen
    kernel over every window where ``attention_path`` allows it, else one SDPA call per window (what
    transformers' own SDPA implementation runs)."""
    bounds = kwargs.pop("cu_seq_lens_q")
    kwargs.pop("cu_seq_lens_k", None)
    max_len = kwargs.pop("max_length_q", None)
    kwargs.pop("max_length_k", None)
    kwargs.pop("is_causal", None)
    path = attention_path(query, key, value, kwargs.get("dropout", 0.0))
    if path.name == VARLEN:
        if max_len is None:
            max_len = int((bounds[1:] - bounds[:-1]).max())
        return _varlen(query, key, value, path, bounds, int(max_len), kwargs.get("scaling"), False), None
    lens = (bounds[1:] - bounds[:-1]).tolist()
    return _per_sequence_sdpa(module, query, key, value, lens, False, kwargs), None


def use_varlen_vision_attention(vision: torch.nn.Module) -> None:
    """Route a transformers Qwen2-VL / Qwen2.5-VL vision tower's attention through
    ``windowed_vision_attention`` (its blocks share the tower's config)."""
    vision.config._attn_implementation = VISION_ATTENTION


AttentionInterface.register(PACKED_ATTENTION, packed_causal_attention)
AttentionInterface.register(VISION_ATTENTION, windowed_vision_attention)
