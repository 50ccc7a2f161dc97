"""An omni model's towers as plain numbers: the Whisper-style audio tower (``AudioTower``) and the
Qwen2.5-Omni-7B thinker's published shape (``QWEN25_OMNI_7B_THINKER_CONFIG``), the one place the
preset ``qwen25-omni-7b``'s numbers live (the Omni model family reads them into its shape; the
N-encoder planner prices the audio tower from ``QWEN25_OMNI_7B_AUDIO``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from entrain.core.model.layer_specs import LayerSpec

__all__ = [
    "AudioTower",
    "QWEN25_OMNI_7B",
    "QWEN25_OMNI_7B_THINKER_CONFIG",
    "QWEN25_OMNI_7B_AUDIO",
    "audio_tower_specs",
    "EncoderSwapped",
]


@dataclass(frozen=True, slots=True)
class AudioTower:
    """A Whisper-style audio tower as plain numbers (the fields of a Qwen2.5-Omni ``audio_config``;
    a family's own audio architecture with these fields serves as well)."""

    num_mel_bins: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    d_model: int
    output_dim: int
    n_window: int = 100


QWEN25_OMNI_7B = "qwen25-omni-7b"
"""The ``--model`` preset of the Qwen2.5-Omni-7B thinker (cost model only: training needs the
checkpoint, ``--model-path DIR``)."""

QWEN25_OMNI_7B_THINKER_CONFIG: dict = {
    "tie_word_embeddings": False,
    "audio_config": {
        "num_mel_bins": 128, "encoder_layers": 32, "encoder_attention_heads": 20, "encoder_ffn_dim": 5120,
        "d_model": 1280, "output_dim": 3584, "n_window": 100,
    },
    "vision_config": {
        "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "out_hidden_size": 3584,
        "fullatt_block_indexes": [7, 15, 23, 31], "window_size": 112, "patch_size": 14,
        "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3, "hidden_act": "silu",
    },
    "text_config": {
        "num_hidden_layers": 28, "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
        "num_key_value_heads": 4, "vocab_size": 152064, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "hidden_act": "silu", "use_sliding_window": False,
    },
}  # fmt: skip
"""The shape fields of the Qwen2.5-Omni-7B thinker's ``config.json`` (the family adds its
``model_type``): transformers 5.24's thinker config class defaults (a 32-layer Whisper-large-v3 audio encoder, d_model 1280, 20 heads, FFN 5120, 128 mel bins,
100-frame windows, projected to 3584; a Qwen2.5-VL vision tower of 32 blocks, 16 heads, SwiGLU 3420,
full attention in blocks 7/15/23/31, merging to 3584; a Qwen2.5-7B decoder of 28 layers, hidden 3584,
FFN 18944, 28 query / 4 KV heads, vocabulary 152064, untied lm_head, rope_theta 1e6), except the
vision ``hidden_size``: the config class defaults it to 3584, the released checkpoint's config.json
(and Qwen2.5-VL-7B's tower, whose weights it is) has 1280, which this preset keeps."""


def _audio_tower(config: dict) -> AudioTower:
    return AudioTower(**config["audio_config"])


QWEN25_OMNI_7B_AUDIO = _audio_tower(QWEN25_OMNI_7B_THINKER_CONFIG)
"""Qwen2.5-Omni-7B's ``audio_config`` (a Whisper-large-v3 encoder projected to the LLM width)."""


# --- the audio tower's layer specs (both paths price it from these) -----------------------------------
def audio_tower_specs(audio: AudioTower) -> list[LayerSpec]:
    """Forward work per audio row (a row = two mel frames, what the stride-2 convolution leaves; the
    unit ``audio_encoder_units`` counts): the two convolutions (kind ``patch_embed``), the encoder
    layers (full attention within a chunk, LayerNorm, a two-matrix GELU MLP: kind ``vit_block_full``),
    and the stride-2 pooling + projection to the LLM width (kind ``merger``), so that a hardware preset
    prices them as it prices the vision tower's layers of those kinds. The N-encoder planner prices its
    audio pipeline from these (``planning.encoders.shape_encoders``) and the one-encoder cost model the
    audio tower it runs in the first encoder layer (``costs.presets.build_cost_model``,
    ``LayerCost.audio``)."""
    d, f, heads, mel = audio.d_model, audio.encoder_ffn_dim, audio.encoder_attention_heads, audio.num_mel_bins
    out = audio.output_dim
    conv_params = mel * d * 3 + d + d * d * 3 + d
    specs = [
        LayerSpec(
            "audio.conv", "patch_embed", "encoder", 0.0, 2.0 * (2 * 3 * mel * d) + 2.0 * 3 * d * d, 0.0,
            d, 0, 0.0, heads, 2.0 * 2 * mel + 2.0 * 2 * d, 2.0 * d, conv_params,
        )
    ]  # fmt: skip
    lin = 2.0 * (4 * d * d + 2 * d * f)
    layer_params = 4 * d * d + 3 * d + 4 * d + d * f + f + f * d + d
    for n in range(audio.encoder_layers):
        specs.append(
            LayerSpec(
                f"audio.layers.{n}", "vit_block_full", "encoder", 4.0 * d, lin, 0.0, d, 2, 2.0 * 2 * d,
                heads, 16.0 * d + 4.0 * f, 2.0 * d, layer_params, attention="full", heads=heads,
                attn_lin_flops=2.0 * 4 * d * d, attn_saved_bytes=10.0 * d,
            )
        )  # fmt: skip
    specs.append(
        LayerSpec(
            "audio.proj", "merger", "encoder", 0.0, 2.0 * d * out / 2, 0.0, d, 0, 0.0, heads, 4.0 * d,
            2.0 * out / 2, 2 * d + d * out + out + 2 * out,
        )
    )  # fmt: skip
    return specs


class EncoderSwapped:
    """``shape`` (a ``ModelShape``) with its encoder's layer specs replaced by ``specs``: what a hardware
    preset prices an audio tower as (its layers, ``shape``'s name and LLM)."""

    def __init__(self, shape, specs: Sequence[LayerSpec]):
        self.name, self._shape, self._specs = shape.name, shape, list(specs)

    def layer_specs(self, label_fraction: float | None = None) -> dict[str, list[LayerSpec]]:
        return {"encoder": list(self._specs), "llm": list(self._shape.layer_specs(label_fraction)["llm"])}

    def num_params(self) -> int:
        return sum(s.param_count for c in self.layer_specs().values() for s in c)
