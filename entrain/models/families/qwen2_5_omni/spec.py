"""A Qwen2.5-Omni thinker's architecture from its ``config.json`` (torch-free).

The thinker is Qwen2.5-VL's vision tower (window attention, RMSNorm, gated MLP, patch merger) and a
Qwen2 language model with time-aligned M-RoPE, plus a Whisper-style audio tower (two convolutions,
LayerNorm encoder layers over 2 x ``n_window``-frame chunks, average pooling, a projection to the LLM
width). A thinker folder (``model_type`` ``qwen2_5_omni_thinker``) or a whole Qwen2.5-Omni folder
(``qwen2_5_omni``: its ``thinker_config``; the talker and token2wav are not trained) is read.

``OmniShape`` is the ``ModelShape``: the ``ModelArch`` of vision tower and LLM, and the audio tower,
whose parameters the cost model places on the layer holding the vision ``patch_embed`` (the audio
tower runs on the first encoder stage). A clip's audio tokens add LLM work (``SampleMeta.llm_tokens``);
the audio tower's work is priced approximately, as rows of the vision tower's layers (one unit per
attention chunk, ``SampleMeta.encoder_units``), spread over the encoder stages like the vision work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from entrain.core.errors import ConfigError
from entrain.core.model.architectures import LLMArch, ModelArch, VisionArch
from entrain.core.model.omni import AudioTower
from entrain.models.families.composition.spec import processor_limits, vision_arch_of_config
from entrain.models.families.qwen2_vl.spec import text_arch
from entrain.models.families.registry import read_config

__all__ = ["MODEL_TYPES", "ENCODER_PARTS", "AudioArch", "OmniShape", "claims", "thinker_config_of", "check_supported",
           "shape_of_config", "shape_of_folder"]  # fmt: skip

MODEL_TYPES = ("qwen2_5_omni_thinker", "qwen2_5_omni")
AUDIO_PART = "audio"
"""The message part of the audio tower's features (``model.AUDIO``)."""
ENCODER_PARTS = {"vision": ("hidden", "image_tokens"), AUDIO_PART: (AUDIO_PART, "audio_tokens")}
"""With an encoder pipeline per tower (``StageSpec.encoder``): the part of the first LLM stage's input
each tower's output becomes (the visual features are its ``hidden``) and its rows per sample."""
_AUDIO_FIELDS = ("num_mel_bins", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim", "d_model")


def claims(config: dict) -> bool:
    return config.get("model_type") in MODEL_TYPES


def thinker_config_of(config: dict, where: str) -> dict:
    """The thinker's config: the folder's own, or a whole Qwen2.5-Omni folder's ``thinker_config``."""
    if config.get("model_type") == "qwen2_5_omni":
        thinker = config.get("thinker_config")
        if not isinstance(thinker, dict):
            raise ConfigError(f"{where}: a qwen2_5_omni config.json needs a thinker_config object")
        return thinker
    return config


@dataclass(frozen=True)
class AudioArch(AudioTower):
    """The audio tower as plain numbers (``audio_config``): the planner's ``AudioTower`` (its fields
    written once, in ``entrain.core.model.omni``) with the checkpoint's parameter count."""

    def num_params(self) -> int:
        d, f = self.d_model, self.encoder_ffn_dim
        convs = self.num_mel_bins * d * 3 + d + d * d * 3 + d
        layer = 4 * d * d + 3 * d + 4 * d + d * f + f + f * d + d  # k_proj has no bias
        return (
            convs
            + 2 * self.output_dim
            + self.encoder_layers * layer
            + 2 * d
            + d * self.output_dim
            + self.output_dim
        )


@dataclass(frozen=True)
class OmniShape:
    """A Qwen2.5-Omni thinker as plain numbers: ``arch`` (vision tower + LLM) and ``audio``."""

    arch: ModelArch
    audio: AudioArch
    description: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        return self.arch.name

    @property
    def vision(self) -> VisionArch:
        return self.arch.vision

    @property
    def llm(self) -> LLMArch:
        return self.arch.llm

    def layer_specs(self, label_fraction: float | None = None) -> dict:
        """The vision tower + decoder specs; the audio tower's parameters on ``patch_embed``; every
        encoder cut carries the ``audio`` part (one row per audio token) to the first LLM stage."""
        from entrain.core.model.layer_specs import MessagePart

        specs = self.arch.layer_specs(label_fraction)
        enc = list(specs["encoder"])
        enc[0] = replace(enc[0], param_count=enc[0].param_count + self.audio.num_params())
        audio = (MessagePart(AUDIO_PART, self.audio.output_dim, rows="audio_tokens"),)
        enc = [replace(s, message_parts=s.message_parts + audio) for s in enc]
        return {"encoder": enc, "llm": list(specs["llm"])}

    def num_params(self) -> int:
        return sum(s.param_count for c in self.layer_specs().values() for s in c)


def check_supported(config: dict, where: str) -> None:
    """Refuse what the stages do not reproduce exactly, naming the field."""
    if not claims(config):
        raise ConfigError(
            f"{where}: model_type {config.get('model_type')!r} is not a Qwen2.5-Omni thinker checkpoint "
            f"(expected one of {', '.join(MODEL_TYPES)})"
        )
    thinker = thinker_config_of(config, where)
    text = thinker.get("text_config") or {}
    if text.get("use_sliding_window"):
        raise ConfigError(
            f"{where}: text_config use_sliding_window true is not supported: the packed attention is full "
            "causal attention per sample"
        )
    heads = int(text.get("num_attention_heads") or 1)
    width = int(text.get("hidden_size") or 0) // heads
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    section = rope.get("mrope_section") if isinstance(rope, dict) else None
    if section is not None and 2 * sum(section) != width:
        raise ConfigError(
            f"{where}: text_config mrope_section {list(section)} sums to {sum(section)}, not half the head "
            f"dimension {width}"
        )
    vision = thinker.get("vision_config") or {}
    if int(vision.get("in_channels", 3)) != 3:
        raise ConfigError(
            f"{where}: vision_config in_channels {vision['in_channels']} is not supported (RGB only)"
        )
    if not isinstance(thinker.get("audio_config"), dict):
        raise ConfigError(f"{where}: the thinker's config lacks audio_config")


def _audio(thinker: dict, where: str) -> AudioArch:
    a = thinker["audio_config"]
    missing = [k for k in _AUDIO_FIELDS if k not in a]
    if missing:
        raise ConfigError(f"{where}: audio_config lacks {', '.join(missing)}")
    try:
        return AudioArch(**{k: int(a[k]) for k in _AUDIO_FIELDS}, output_dim=int(a.get("output_dim", 3584)),
                         n_window=int(a.get("n_window", 100)))  # fmt: skip
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: bad audio_config value ({e})") from None


def shape_of_config(config: dict, where: str, name: str, limits: dict | None = None) -> OmniShape:
    check_supported(config, where)
    thinker = thinker_config_of(config, where)
    vision = vision_arch_of_config(
        thinker.get("vision_config") or {}, "qwen2_5_vl", f"{where}: vision_config"
    )
    if limits:
        vision = replace(vision, **limits)
    tied = bool(thinker.get("tie_word_embeddings", False))  # the thinker's flag, not its text_config's
    text = {**(thinker.get("text_config") or {}), "tie_word_embeddings": tied}
    llm = text_arch({**thinker, "tie_word_embeddings": tied, "text_config": text}, where)
    audio = _audio(thinker, where)
    for what, width in (("vision_config out_hidden_size", vision.out_hidden_size),
                        ("audio_config output_dim", audio.output_dim)):  # fmt: skip
        if width != llm.hidden_size:
            raise ConfigError(
                f"{where}: {what} {width} is not the language model's hidden size {llm.hidden_size}"
            )
    arch = ModelArch(name=name, vision=vision, llm=llm, description=f"{config.get('model_type')} {where}")
    return OmniShape(arch, audio, description=arch.description)


def shape_of_folder(folder: str) -> OmniShape:
    where = os.path.join(folder, "config.json")
    name = f"hf:{os.path.basename(os.path.normpath(folder))}"
    return shape_of_config(read_config(folder), where, name, processor_limits(folder))
