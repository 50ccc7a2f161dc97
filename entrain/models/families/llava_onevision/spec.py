"""LLaVA-OneVision's shape as plain numbers (torch-free): ``config.json`` reading, and the
per-layer cost specs the planner prices (``entrain.core.model.layer_specs.LayerSpec``).

The encoder's sequence unit is one 384-px tile (729 SigLIP tokens at patch 14): every tile attends
only within itself, so an image's encoder work is ``tiles x tokens per tile`` (linear terms) plus
``tiles x 729**2`` (attention scores). The LLM is a Qwen2 decoder priced as the composition's
(``LLMArch`` with ``qkv_bias=True``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from entrain.core.errors import ConfigError
from entrain.core.model.architectures import LLMArch
from entrain.core.model.layer_specs import LayerSpec, llm_specs
from entrain.models.families.llava_onevision.processing import OneVisionRules
from entrain.models.families.tiled_family import llm_arch_of

__all__ = ["SiglipArch", "OneVisionShape", "shape_from_config"]


@dataclass(frozen=True, slots=True)
class SiglipArch:
    """A SigLIP vision tower (``SiglipVisionModel``): patch conv + learned positions, pre-norm
    encoder layers (full attention within a tile, GELU MLP); only the layers up to
    ``vision_feature_layer`` count (``num_layers``)."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    image_size: int = 384
    patch_size: int = 14
    num_channels: int = 3

    @property
    def tokens_per_tile(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def patch_dim(self) -> int:
        return self.num_channels * self.patch_size * self.patch_size

    def embeddings_params(self) -> int:
        h = self.hidden_size
        return self.patch_dim * h + h + self.tokens_per_tile * h

    def layer_params(self) -> int:
        h, i = self.hidden_size, self.intermediate_size
        return 4 * (h * h + h) + 2 * h * i + i + h + 4 * h


@dataclass(frozen=True, slots=True)
class OneVisionShape:
    """``ModelShape`` of a LLaVA-OneVision model: SigLIP tiles -> 2-layer GELU projector (+ pack with
    ``image_newline``) -> Qwen2."""

    name: str
    vision: SiglipArch
    llm: LLMArch
    rules: OneVisionRules = field(default_factory=OneVisionRules)
    projector_bias: bool = True
    description: str = field(default="", compare=False)

    def projector_params(self) -> int:
        """linear_1 (vision -> LLM width), linear_2, their biases, and ``image_newline``."""
        h, d = self.llm.hidden_size, self.vision.hidden_size
        return d * h + h * h + (2 * h if self.projector_bias else 0) + h

    def num_params(self) -> int:
        v = self.vision
        return (
            v.embeddings_params()
            + v.num_layers * v.layer_params()
            + self.projector_params()
            + self.llm.num_params()
        )

    def layer_specs(self, label_fraction: float | None = None) -> dict[str, list[LayerSpec]]:
        return {"encoder": _encoder_specs(self), "llm": llm_specs(self.llm, label_fraction)}


def _encoder_specs(shape: OneVisionShape) -> list[LayerSpec]:
    """Per token of one tile (the unit): embeddings, SigLIP layers (full attention within the tile),
    the merger (projector on every vision token, then unpad/shrink/newline: memory-bound)."""
    v, big = shape.vision, shape.llm.hidden_size
    h, i, heads = v.hidden_size, v.intermediate_size, v.num_heads
    attn_lin = 2.0 * 4 * h * h
    specs = [
        LayerSpec("embeddings", "patch_embed", "encoder", 0.0, 2.0 * v.patch_dim * h, 0.0, h, 0, 0.0, heads,
                  2.0 * v.patch_dim, 2.0 * h, v.embeddings_params()),
    ]  # fmt: skip
    for n in range(v.num_layers):
        specs.append(
            LayerSpec(
                f"layers.{n}",
                "vit_block_full",
                "encoder",
                4.0 * h,
                attn_lin + 2.0 * 2 * h * i,
                0.0,
                h,
                2,
                4.0 * h,
                heads,
                16.0 * h + 4.0 * i,
                2.0 * h,
                v.layer_params(),
                attention="full",
                heads=heads,
                attn_lin_flops=attn_lin,
                attn_saved_bytes=10.0 * h,
            )  # fmt: skip
        )
    proj = 2.0 * (h * big + big * big)
    specs.append(
        LayerSpec(
            "merger",
            "merger",
            "encoder",
            0.0,
            proj,
            4.0 * 2 * big,
            h,
            0,
            0.0,
            heads,
            2.0 * h + 4.0 * big,
            2.0 * big,
            shape.projector_params(),
        )  # fmt: skip
    )
    return specs


def check_supported(config: dict, where: str = "config.json") -> None:
    """Refuse what the stages do not reproduce exactly (``plan`` and ``train`` alike)."""
    strategy = config.get("vision_feature_select_strategy", "full")
    if strategy != "full":
        raise ConfigError(
            f"{where}: vision_feature_select_strategy {strategy!r} is not supported: 'full' only (SigLIP has "
            "no CLS token to drop)"
        )
    if (config.get("text_config") or {}).get("use_sliding_window", False):
        raise ConfigError(f"{where}: text_config.use_sliding_window is not supported by packed attention")
    layer = config.get("vision_feature_layer", -1)
    if isinstance(layer, list):
        raise ConfigError(
            f"{where}: vision_feature_layer {layer!r} is not supported: one layer only (the stages pass one "
            "hidden state between them, not several concatenated)"
        )
    if layer == 0:  # transformers asks the tower for output_hidden_states=0: none, and fails
        total = int((config.get("vision_config") or {}).get("num_hidden_layers", 26))
        raise ConfigError(
            f"{where}: vision_feature_layer 0 is not supported: transformers' LlavaOnevision cannot run it "
            f"(it reads no hidden states for 0); the embeddings' output is vision_feature_layer {-total - 1}"
        )


def shape_from_config(config: dict, name: str, where: str = "config.json") -> OneVisionShape:
    """The shape of a ``LlavaOnevisionConfig`` given as its ``config.json`` dict (fields missing from a
    sub-config take transformers' defaults for LLaVA-OneVision's SigLIP)."""
    vision = config.get("vision_config") or {}
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"{where}: missing field 'text_config'")
    check_supported(config, where)
    total = int(vision.get("num_hidden_layers", 26))
    layer = config.get("vision_feature_layer", -1)
    if not isinstance(layer, int) or not -total - 1 <= layer <= total:
        raise ConfigError(f"{where}: vision_feature_layer {layer!r} is not one layer of 0..{total}")
    try:
        rules = OneVisionRules.from_config(config, where)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    siglip = SiglipArch(
        num_layers=layer if layer >= 0 else total + 1 + layer,
        hidden_size=int(vision.get("hidden_size", 1152)),
        intermediate_size=int(vision.get("intermediate_size", 4304)),
        num_heads=int(vision.get("num_attention_heads", 16)),
        image_size=rules.tile_px,
        patch_size=rules.patch_px,
    )
    tie = bool(config.get("tie_word_embeddings") or text.get("tie_word_embeddings"))
    llm = llm_arch_of(text, where, tie_word_embeddings=tie, qkv_bias=True)  # Qwen2 takes head_dim as given
    return OneVisionShape(name, siglip, llm, rules, bool(config.get("multimodal_projector_bias", True)))


def check_processor(folder: str, rules: OneVisionRules) -> None:
    """The folder's ``preprocessor_config.json`` (if any) tiles as ``config.json`` says: its ``size``
    is the tile's side and its ``image_grid_pinpoints`` the config's (the token counts, the plan and
    the pixels the model sees all follow the config), and it resizes; ConfigError naming the file and
    field otherwise. Its normalisation is read by the processor itself (``processing.shape_processor``)."""
    import json
    import os

    path = os.path.join(folder, "preprocessor_config.json")
    if not os.path.isfile(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            proc = json.load(f)
        size = proc.get("size", {})
        sides = {size.get(k) for k in ("height", "width", "shortest_edge") if size.get(k) is not None}
        pinpoints = proc.get("image_grid_pinpoints")
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"{path}: cannot read it ({e})") from None
    if sides and sides != {rules.tile_px}:
        raise ConfigError(
            f"{path}: size {size} differs from the config's {rules.tile_px}-px tiles (vision_config.image_size)"
        )
    if pinpoints is not None and [tuple(p) for p in pinpoints] != [tuple(p) for p in rules.grid_pinpoints]:
        raise ConfigError(f"{path}: image_grid_pinpoints differ from config.json's image_grid_pinpoints")
    if proc.get("do_resize", True) is False:
        raise ConfigError(f"{path}: do_resize False is not supported (every image is resized into tiles)")
