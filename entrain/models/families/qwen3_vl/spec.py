"""A whole Qwen3-VL checkpoint's architecture from its ``config.json`` (torch-free).

The vision tower: 16-px patches with a learned position table (``num_position_embeddings``, resampled
to each image's grid) and 2-D rotary, LayerNorm blocks with a plain GELU MLP and full attention per
image, a patch merger to the LLM width, and one more merger per DeepStack tap
(``deepstack_visual_indexes``) whose output is added to the hidden states of the first LLM layers at
the visual tokens. The language model is Qwen3 (q/k RMSNorm, no q/k/v bias, explicit ``head_dim``)
with interleaved M-RoPE, which changes no FLOP or byte.

``Qwen3VLShape`` is the ``ModelShape``: the ``ModelArch`` of tower and decoder, plus the DeepStack
mergers (priced on the stage of their tapped block, which applies them) and the position table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from entrain.core.errors import ConfigError
from entrain.core.model.architectures import LLMArch, ModelArch, VisionArch
from entrain.models.families.registry import read_config

__all__ = ["MODEL_TYPES", "Qwen3VLShape", "claims", "shape_of_config", "shape_of_folder", "deepstack_part"]

MODEL_TYPES = ("qwen3_vl",)
_TEXT_FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
_VISION_FIELDS = ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size")


def deepstack_part(k: int) -> str:
    """The message part carrying the ``k``-th DeepStack feature (``[M, H]``, rows = visual tokens)."""
    return f"deepstack_{k}"


def claims(config: dict) -> bool:
    return config.get("model_type") in MODEL_TYPES


@dataclass(frozen=True)
class Qwen3VLShape:
    """Qwen3-VL as plain numbers: ``arch`` (tower + decoder as a ``ModelArch``), the tapped vision
    blocks ``deepstack`` (tap ``k`` feeds LLM decoder layer ``k``) and the learned position table's
    ``num_position_embeddings``."""

    arch: ModelArch
    deepstack: tuple[int, ...]
    num_position_embeddings: int
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

    def deepstack_merger_params(self) -> int:
        v = self.vision
        m = v.merger_hidden
        return 2 * m + (m * m + m) + (m * v.out_hidden_size + v.out_hidden_size)

    def layer_specs(self, label_fraction: float | None = None) -> dict:
        """The ViT + decoder specs, with Qwen3-VL's extras: the patch embedding's bias and position
        table, each tapped block's DeepStack merger (FLOPs per patch, parameters), each decoder
        layer's q/k norms."""
        specs = self.arch.layer_specs(label_fraction)
        v, llm = self.vision, self.llm
        m = v.merger_hidden
        merger_lin = (2.0 * m * m + 2.0 * m * v.out_hidden_size) / v.merge_factor
        enc = list(specs["encoder"])
        extra = v.hidden_size + self.num_position_embeddings * v.hidden_size
        enc[0] = replace(enc[0], param_count=enc[0].param_count + extra)
        for b in self.deepstack:
            s = enc[1 + b]
            enc[1 + b] = replace(
                s,
                lin_flops=s.lin_flops + merger_lin,
                param_count=s.param_count + self.deepstack_merger_params(),
            )
        head = llm.head_dim or llm.hidden_size // llm.num_attention_heads
        dec = [
            replace(s, param_count=s.param_count + 2 * head) if s.kind == "decoder_layer" else s
            for s in specs["llm"]
        ]
        return {"encoder": self._with_parts(enc, "encoder"), "llm": self._with_parts(dec, "llm")}

    def message_parts(self, component: str, layer: int) -> tuple:
        """The DeepStack parts crossing a cut right after layer ``layer`` of ``component``'s list:
        encoder: the features of the taps at or before it (made by the stage holding the tapped block,
        ``[patches / merge^2, H]``); LLM: those its decoder layers up to ``layer`` have not added yet
        (decoder layer ``k`` is list index ``k + 1`` and adds feature ``k``)."""
        from entrain.core.model.layer_specs import MessagePart

        width = self.vision.out_hidden_size
        if component == "encoder":
            made = [k for k, b in enumerate(self.deepstack) if b + 1 <= layer]
            per = 1.0 / self.vision.merge_factor
            return tuple(
                MessagePart(deepstack_part(k), width, rows="tokens", rows_per_token=per) for k in made
            )
        left = [k for k in range(len(self.deepstack)) if k >= layer]
        return tuple(MessagePart(deepstack_part(k), width, rows="image_tokens") for k in left)

    def _with_parts(self, specs: list, component: str) -> list:
        return [replace(s, message_parts=self.message_parts(component, j)) for j, s in enumerate(specs)]

    def num_params(self) -> int:
        return sum(s.param_count for c in self.layer_specs().values() for s in c)


def _ints(d: dict, keys, where: str) -> dict:
    missing = [k for k in keys if k not in d]
    if missing:
        raise ConfigError(f"{where}: lacks {', '.join(missing)}")
    try:
        return {k: int(d[k]) for k in keys}
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: bad value ({e})") from None


def _vision(config: dict, where: str) -> tuple[VisionArch, tuple[int, ...], int]:
    v = config.get("vision_config")
    if not isinstance(v, dict):
        raise ConfigError(f"{where}: vision_config missing or not an object")
    n = _ints(v, _VISION_FIELDS, f"{where}: vision_config")
    taps = tuple(int(i) for i in v.get("deepstack_visual_indexes", (8, 16, 24)))
    bad = [i for i in taps if not 0 <= i < n["depth"]]
    if bad or len(set(taps)) != len(taps) or list(taps) != sorted(taps):
        raise ConfigError(
            f"{where}: vision_config deepstack_visual_indexes {list(taps)}: expected distinct ascending block "
            f"indexes in 0..{n['depth'] - 1}"
        )
    if int(v.get("in_channels", 3)) != 3:
        raise ConfigError(
            f"{where}: vision_config in_channels {v['in_channels']} is not supported (RGB only)"
        )
    arch = VisionArch(
        **n,
        fullatt_block_indexes=tuple(range(n["depth"])),
        patch_size=int(v.get("patch_size", 16)),
        temporal_patch_size=int(v.get("temporal_patch_size", 2)),
        spatial_merge_size=int(v.get("spatial_merge_size", 2)),
        hidden_act=str(v.get("hidden_act", "gelu_pytorch_tanh")),
        norm="layer",
        mlp="plain",
    )
    return arch, taps, int(v.get("num_position_embeddings", 2304))


def _text(config: dict, where: str) -> LLMArch:
    t = config.get("text_config")
    if not isinstance(t, dict):
        raise ConfigError(f"{where}: text_config missing or not an object")
    n = _ints(t, _TEXT_FIELDS, f"{where}: text_config")
    rope = t.get("rope_parameters") or t.get("rope_scaling") or {}
    heads = n["num_attention_heads"]
    head_dim = int(t.get("head_dim") or n["hidden_size"] // heads)
    section = rope.get("mrope_section") if isinstance(rope, dict) else None
    if section is not None and 2 * sum(section) != head_dim:
        raise ConfigError(
            f"{where}: text_config mrope_section {list(section)} sums to {sum(section)}, not half of head_dim "
            f"{head_dim}"
        )
    tied = bool(config.get("tie_word_embeddings") or t.get("tie_word_embeddings"))
    return LLMArch(
        **n,
        num_key_value_heads=int(t.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        tie_word_embeddings=tied,
        rope_theta=float(t.get("rope_theta") or rope.get("rope_theta") or 5_000_000.0),
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(t.get("max_position_embeddings", 262_144)),
        hidden_act=str(t.get("hidden_act", "silu")),
        attention_bias=bool(t.get("attention_bias", False)),
    )


def shape_of_config(config: dict, where: str, name: str, limits: dict | None = None) -> Qwen3VLShape:
    """The ``Qwen3VLShape`` of a ``config.json`` dict; ConfigError naming ``where`` and the field."""
    if not claims(config):
        raise ConfigError(
            f"{where}: model_type {config.get('model_type')!r} is not a whole Qwen3-VL checkpoint "
            f"(expected one of {', '.join(MODEL_TYPES)})"
        )
    vision, taps, table = _vision(config, where)
    if limits:
        vision = replace(vision, **limits)
    llm = _text(config, where)
    if len(taps) > llm.num_hidden_layers:
        raise ConfigError(f"{where}: {len(taps)} DeepStack taps but only {llm.num_hidden_layers} LLM layers")
    if vision.out_hidden_size != llm.hidden_size:
        raise ConfigError(
            f"{where}: vision_config out_hidden_size {vision.out_hidden_size} is not the language model's "
            f"hidden_size {llm.hidden_size}"
        )
    arch = ModelArch(name=name, vision=vision, llm=llm, description=f"qwen3_vl {where}")
    return Qwen3VLShape(arch, taps, table, description=arch.description)


def shape_of_folder(folder: str) -> Qwen3VLShape:
    from entrain.models.families.composition.spec import processor_limits

    where = os.path.join(folder, "config.json")
    name = f"hf:{os.path.basename(os.path.normpath(folder))}"
    return shape_of_config(read_config(folder), where, name, processor_limits(folder))
