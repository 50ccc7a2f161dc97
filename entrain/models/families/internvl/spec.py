"""InternVL's shape as plain numbers (torch-free): ``config.json`` (+ ``preprocessor_config.json``)
reading, and the per-layer cost specs the planner prices (``entrain.core.model.layer_specs.LayerSpec``).

The encoder's sequence unit is one tile: ``side**2`` patches plus the CLS token attend within the
tile, so an image's encoder work is ``tiles x tokens per tile`` (linear terms) plus ``tiles x
tokens**2`` (scores). The merger (CLS drop, pixel shuffle, LayerNorm + 2-layer GELU projector) reads
every vision token and writes ``downsample_ratio**2`` as many LLM tokens. The LLM is a Qwen2, Qwen3 or
Llama decoder priced as ``LLMArch``; Qwen3's per-head RMSNorm of q and k (``q_norm`` / ``k_norm``) is
added to each decoder layer's parameters, memory traffic and saved activations.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from entrain.core.errors import ConfigError
from entrain.core.model.architectures import LLMArch
from entrain.core.model.layer_specs import LayerSpec, llm_specs
from entrain.models.families.internvl.processing import InternVLRules
from entrain.models.families.tiled_family import llm_arch_of

__all__ = ["InternViTArch", "InternVLShape", "shape_from_config", "TEXT_MODEL_TYPES"]

TEXT_MODEL_TYPES = ("qwen2", "qwen3", "llama")
"""Language models the LLM stages run (transformers' decoder layers with packed attention)."""


@dataclass(frozen=True, slots=True)
class InternViTArch:
    """An InternViT tower (``InternVLVisionModel``): patch conv + CLS + learned positions, pre-norm
    layers with layer scale (``lambda_1`` / ``lambda_2``), full attention within a tile, GELU MLP."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    image_size: int = 448
    patch_size: int = 14
    num_channels: int = 3
    attention_bias: bool = True
    qk_norm: bool = False
    layer_norm: bool = True
    """``norm_type == "layer_norm"`` (weight and bias), else RMSNorm (weight)."""
    final_norm: bool = False
    """``use_mean_pooling == False``: the tower's last ``layernorm`` runs before the merger."""

    @property
    def patches_per_tile(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_tile(self) -> int:
        """Tokens of one tile's sequence: the patches and the CLS token."""
        return self.patches_per_tile + 1

    @property
    def patch_dim(self) -> int:
        return self.num_channels * self.patch_size * self.patch_size

    def embeddings_params(self) -> int:
        h = self.hidden_size
        return self.patch_dim * h + h + h + self.tokens_per_tile * h

    def norm_params(self) -> int:
        return (2 if self.layer_norm else 1) * self.hidden_size

    def layer_params(self) -> int:
        h, i = self.hidden_size, self.intermediate_size
        attn = 4 * h * h + (3 * h if self.attention_bias else 0) + h + (2 * h if self.qk_norm else 0)
        return attn + 2 * h * i + i + h + 2 * self.norm_params() + 2 * h


@dataclass(frozen=True, slots=True)
class InternVLShape:
    """``ModelShape`` of an InternVL model: InternViT tiles -> pixel shuffle + projector -> LLM."""

    name: str
    vision: InternViTArch
    llm: LLMArch
    rules: InternVLRules = field(default_factory=InternVLRules)
    qk_norm: bool = False
    """The LLM's decoder layers normalise q and k per head (Qwen3)."""
    description: str = field(default="", compare=False)

    @property
    def shuffle(self) -> int:
        """Vision tokens merged into one LLM token (4 at ``downsample_ratio`` 0.5)."""
        return round(1 / self.rules.downsample_ratio**2)

    def projector_params(self) -> int:
        """LayerNorm and linear_1 over the shuffled width, linear_2 (biases included); the tower's
        final norm when it runs."""
        wide, h = self.vision.hidden_size * self.shuffle, self.llm.hidden_size
        final = self.vision.norm_params() if self.vision.final_norm else 0
        return 2 * wide + wide * h + h + h * h + h + final

    def llm_layer_params(self) -> int:
        return self.llm.layer_params() + (2 * self.llm.head_dim if self.qk_norm else 0)

    def num_params(self) -> int:
        v, n = self.vision, self.llm.num_hidden_layers
        qk = 2 * self.llm.head_dim * n if self.qk_norm else 0
        return (
            v.embeddings_params()
            + v.num_layers * v.layer_params()
            + self.projector_params()
            + self.llm.num_params()
            + qk
        )

    def layer_specs(self, label_fraction: float | None = None) -> dict[str, list[LayerSpec]]:
        return {"encoder": _encoder_specs(self), "llm": _llm_specs(self, label_fraction)}


def _encoder_specs(shape: InternVLShape) -> list[LayerSpec]:
    """Per token of one tile (the unit): embeddings, InternViT layers (every one alike), the merger."""
    v, big, k = shape.vision, shape.llm.hidden_size, shape.shuffle
    h, i, heads = v.hidden_size, v.intermediate_size, v.num_heads
    attn = 2.0 * 4 * h * h
    block = LayerSpec(
        "layers.0", "vit_block_full", "encoder", quad_flops=4.0 * h, lin_flops=attn + 4.0 * h * i, mem_bytes=0.0,
        hidden=h, tp_allreduces=2, cp_kv_bytes=4.0 * h, max_tp=heads, activation_bytes_per_token=16.0 * h + 4.0 * i,
        output_bytes_per_token=2.0 * h, param_count=v.layer_params(), attention="full", heads=heads,
        attn_lin_flops=attn, attn_saved_bytes=10.0 * h,
    )  # fmt: skip
    embeddings = LayerSpec(
        "embeddings", "patch_embed", "encoder", quad_flops=0.0, lin_flops=2.0 * v.patch_dim * h, mem_bytes=0.0,
        hidden=h, tp_allreduces=0, cp_kv_bytes=0.0, max_tp=heads, activation_bytes_per_token=2.0 * v.patch_dim,
        output_bytes_per_token=2.0 * h, param_count=v.embeddings_params(),
    )  # fmt: skip
    # per vision token: linear_1 over k tokens' width, linear_2 on 1/k of an LLM token
    merger = LayerSpec(
        "merger", "merger", "encoder", quad_flops=0.0, lin_flops=2.0 * (h * big + big * big / k), mem_bytes=8.0 * h,
        hidden=h, tp_allreduces=0, cp_kv_bytes=0.0, max_tp=heads, activation_bytes_per_token=4.0 * h + 4.0 * big / k,
        output_bytes_per_token=2.0 * big / k, param_count=shape.projector_params(),
    )  # fmt: skip
    return [embeddings, *(replace(block, name=f"layers.{n}") for n in range(v.num_layers)), merger]


def _llm_specs(shape: InternVLShape, label_fraction: float | None) -> list[LayerSpec]:
    """``llm_specs`` of the decoder; with ``qk_norm`` each decoder layer also reads and writes q and k
    once more (bf16), saves the norms' inputs, and holds ``2 * head_dim`` norm weights."""
    specs = llm_specs(shape.llm, label_fraction)
    if not shape.qk_norm:
        return specs
    qk = shape.llm.q_dim + shape.llm.kv_dim
    return [
        replace(
            s,
            mem_bytes=s.mem_bytes + 4.0 * qk,
            activation_bytes_per_token=s.activation_bytes_per_token + 2.0 * qk,
            attn_saved_bytes=s.attn_saved_bytes + 2.0 * qk,
            param_count=s.param_count + 2 * shape.llm.head_dim,
        )  # fmt: skip
        if s.kind == "decoder_layer"
        else s
        for s in specs
    ]


def _side(value, where: str, key: str) -> int:
    """A square ``image_size`` / ``patch_size`` (an int or ``[h, w]`` with h == w)."""
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ConfigError(f"{where}: vision_config.{key} {value!r} is not square")
        value = value[0]
    return int(value)


def check_supported(config: dict, where: str = "config.json") -> None:
    """Refuse what the stages do not reproduce exactly (``plan`` and ``train`` alike)."""
    layer = config.get("vision_feature_layer", -1)
    if layer != -1:
        raise ConfigError(
            f"{where}: vision_feature_layer {layer!r} is not supported: -1 only (the last layer's output)"
        )
    strategy = config.get("vision_feature_select_strategy", "default")
    if strategy != "default":
        raise ConfigError(
            f"{where}: vision_feature_select_strategy {strategy!r} is not supported: 'default' only (the "
            "CLS token dropped before the pixel shuffle)"
        )
    text = config.get("text_config") or {}
    kind = text.get("model_type", "qwen2")
    if kind not in TEXT_MODEL_TYPES:
        raise ConfigError(
            f"{where}: text_config.model_type {kind!r} is not supported: one of {', '.join(TEXT_MODEL_TYPES)}"
        )
    if text.get("use_sliding_window", False):
        raise ConfigError(f"{where}: text_config.use_sliding_window is not supported by packed attention")
    vision = config.get("vision_config") or {}
    if vision.get("use_mask_token", False):
        raise ConfigError(f"{where}: vision_config.use_mask_token is not supported (masked image modelling)")


def rules_of(config: dict, processor: dict | None, where: str) -> InternVLRules:
    """The tiling rules of ``config.json`` and the folder's ``preprocessor_config.json`` (``processor``;
    None: transformers' defaults, 1..12 tiles)."""
    vision = config.get("vision_config") or {}
    tile = _side(vision.get("image_size", 448), where, "image_size")
    processor = processor or {}
    size = processor.get("size") or {"height": tile, "width": tile}
    if (size.get("height"), size.get("width")) != (tile, tile):
        raise ConfigError(
            f"{where}: preprocessor_config.json size {size} differs from vision_config.image_size {tile} (the "
            "tower would interpolate its position embeddings; not supported)"
        )
    try:
        rules = InternVLRules(
            tile_px=tile,
            patch_px=_side(vision.get("patch_size", 14), where, "patch_size"),
            downsample_ratio=float(config.get("downsample_ratio", 0.5)),
            min_tiles=int(processor.get("min_patches", 1)),
            max_tiles=int(processor.get("max_patches", 12)),
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None
    seq = int(config.get("image_seq_length", rules.tokens_per_tile))
    if seq != rules.tokens_per_tile:
        raise ConfigError(
            f"{where}: image_seq_length {seq} differs from the pixel shuffle's {rules.tokens_per_tile} tokens "
            f"per tile ((image_size / patch_size * downsample_ratio)**2)"
        )
    return rules


def shape_from_config(config: dict, name: str, where: str = "config.json", processor: dict | None = None):
    """The ``InternVLShape`` of an ``InternVLConfig`` given as its ``config.json`` dict (missing vision
    fields take transformers' ``InternVLVisionConfig`` defaults) and the folder's image processor config."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"{where}: missing field 'text_config'")
    check_supported(config, where)
    rules = rules_of(config, processor, where)
    vision = config.get("vision_config") or {}
    vit = InternViTArch(
        num_layers=int(vision.get("num_hidden_layers", 24)),
        hidden_size=int(vision.get("hidden_size", 1024)),
        intermediate_size=int(vision.get("intermediate_size", 4096)),
        num_heads=int(vision.get("num_attention_heads", 16)),
        image_size=rules.tile_px,
        patch_size=rules.patch_px,
        num_channels=int(vision.get("num_channels", 3)),
        attention_bias=bool(vision.get("attention_bias", False)),
        qk_norm=bool(vision.get("use_qk_norm", False)),
        layer_norm=vision.get("norm_type", "layer_norm") == "layer_norm",
        final_norm=not vision.get("use_mean_pooling", True),
    )
    kind = text.get("model_type", "qwen2")
    llm = llm_arch_of(
        text,
        where,
        tie_word_embeddings=False,  # trained untied: the embedding and lm_head may sit on different stages
        qkv_bias=kind == "qwen2",
        attention_bias=kind != "qwen2" and bool(text.get("attention_bias", False)),
        mlp_bias=kind == "llama" and bool(text.get("mlp_bias", False)),
    )
    return InternVLShape(name, vit, llm, rules, qk_norm=kind == "qwen3")
