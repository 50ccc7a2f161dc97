"""The thinker's audio tower as pipeline stages of its own encoder pipeline (a plan with several
encoders, ``StageSpec.encoder`` ``audio``; docs/design.md, "N encoders").

Layers ``[first, end)`` of ``[conv, layers..., proj]`` (``planning.encoders.audio_tower_specs``'s
order: the two convolutions with the positional embedding, the encoder layers, the stride-2 pooling
with ``ln_post`` and the projection). Every stage takes the clips' frame counts (``audio_lengths``,
from the plan's samples) beside its input: the first stage's ``audio_mel`` ``[frames, mel]``, a later
stage's ``hidden`` ``[rows, d_model]`` (one row per frame after the stride-2 convolution, chunk by
chunk). The last stage's ``hidden`` is ``[audio tokens, H]``. Run whole, the stages compute exactly
what transformers' ``Qwen2_5OmniAudioEncoder.forward`` does.
"""

from __future__ import annotations

import torch
from torch import nn

from entrain.core.model.layer_specs import HIDDEN

__all__ = ["OmniAudioStage", "audio_layer_count", "AUDIO_PREFIX", "AUDIO_MEL"]

AUDIO_PREFIX = "model.audio_tower."
AUDIO_MEL = "audio_mel"
"""The first audio stage's input part: ``[frames, mel]`` (``model``'s message parts)."""


def audio_layer_count(tower: nn.Module) -> int:
    """Layers of the audio pipeline: the convolutions, every encoder layer, the pooled projection."""
    return len(tower.layers) + 2


class OmniAudioStage(nn.Module):
    """Layers ``[first, end)`` of the audio tower (module docstring)."""

    def __init__(self, model: nn.Module, first: int, end: int):
        super().__init__()
        tower = model.model.audio_tower
        n = audio_layer_count(tower)
        self.first, self.end, self.tower = first, end, tower
        self.has_conv, self.has_proj = first == 0, end == n
        self.layer_ids = [i - 1 for i in range(max(first, 1), min(end, n - 1))]
        self.takes_parts = True

    def owned_parameters(self) -> list[tuple[str, nn.Parameter]]:
        t = self.tower
        parts: list[tuple[str, nn.Module]] = []
        if self.has_conv:  # with the unused audio_bos_eos_token, so that the stages own the whole tower
            parts += [("conv1", t.conv1), ("conv2", t.conv2), ("audio_bos_eos_token", t.audio_bos_eos_token)]
        parts += [(f"layers.{i}", t.layers[i]) for i in self.layer_ids]
        if self.has_proj:
            parts += [("ln_post", t.ln_post), ("proj", t.proj)]
        return [(f"{AUDIO_PREFIX}{n}.{pn}", p) for n, m in parts for pn, p in m.named_parameters()]

    def move_to(self, device: torch.device) -> None:
        for _, p in self.owned_parameters():
            p.data = p.data.to(device)
        self.tower.positional_embedding.to(device)

    def out_width(self) -> int:
        return self.tower.proj.out_features if self.has_proj else self.tower.config.d_model

    def forward(self, x: dict, lengths: torch.Tensor) -> torch.Tensor:
        lengths = lengths.to(torch.int64).cpu()
        h = x[AUDIO_MEL] if self.has_conv else x[HIDDEN]
        if not lengths.numel():  # no clip in the (sub-)microbatch: an empty message
            return h.new_zeros((0, self.out_width()))
        chunks = _chunk_lengths(lengths, self.tower.n_window)
        if self.has_conv:
            h = self._convolutions(h, lengths, chunks)
        if self.layer_ids:
            from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import get_audio_cu_seqlens

            cu = get_audio_cu_seqlens(chunks).to(h.device)
            for i in self.layer_ids:
                h = self.tower.layers[i](h, cu_seqlens=cu)[0]
        if self.has_proj:
            from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import get_pool_indices

            pool = get_pool_indices(lengths).to(h.device)
            h = self.tower.proj(self.tower.ln_post((h[pool] + h[pool + 1]) / 2))
        return h

    def _convolutions(self, mel: torch.Tensor, lengths: torch.Tensor, chunks: torch.Tensor) -> torch.Tensor:
        """``Qwen2_5OmniAudioEncoder.forward`` up to its encoder layers: the clips cut into chunks of
        ``2 n_window`` frames, both convolutions and the positional embedding per chunk, the rows of
        each chunk's real frames kept."""
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
            chunk_and_pad_features,
            get_valid_indices,
        )

        t = self.tower
        padded, chunks = chunk_and_pad_features(mel.t().to(t.conv1.weight.dtype), lengths, t.n_window)
        frames = torch.arange(padded.shape[2], device=padded.device)
        mask = (frames < chunks.to(padded.device).unsqueeze(1)).unsqueeze(1).to(padded)
        h = nn.functional.gelu(t.conv1(padded)) * mask
        h = nn.functional.gelu(t.conv2(h)).transpose(1, 2)
        h = h + t.positional_embedding.positional_embedding[: h.shape[1], :].unsqueeze(0).to(h.dtype)
        return torch.index_select(h.reshape(-1, h.shape[-1]), 0, get_valid_indices(chunks).to(h.device))


def _chunk_lengths(lengths: torch.Tensor, n_window: int) -> torch.Tensor:
    """Frames of each attention chunk of the clips (``2 n_window`` but each clip's last)."""
    size = 2 * n_window
    out = []
    for n in lengths.tolist():
        out += [size] * (n // size) + ([n % size] if n % size else [])
    return torch.tensor(out, dtype=torch.int64)
