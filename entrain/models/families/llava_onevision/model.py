"""LLaVA-OneVision as pipeline stages, over transformers' own ``LlavaOnevisionForConditionalGeneration``.

Shape legend: ``n`` tiles of the packed images, ``P`` vision tokens per tile (729 for 384-px tiles
at patch 14), ``D`` SigLIP width, ``M`` LLM image tokens of the packed images (AnyRes: base tile,
unpadded grid, newlines), ``T`` packed LLM tokens, ``H`` LLM width.

* **Encoder** layers: ``[embeddings, encoder layer 0 .. K-1, merger]``, K the layers up to
  ``vision_feature_layer`` (-1: all). Each tile is an independent SigLIP sequence, so the packed
  tiles of every image of a microbatch are one batch ``[n, P, D]``; between stages they travel
  flattened ``[n * P, D]``. The "merger" is the projector + ``pack_image_features`` (unpadding,
  ``vision_aspect_ratio`` shrinking, ``image_newline``), transformers' own code, giving ``[M, H]``
  in image order.
* **LLM** layers: ``[embed_tokens, decoder layers..., norm, lm_head, loss]`` of the Qwen2 language
  model, packed samples with 1-D positions restarting per sample and the packed varlen attention
  (``entrain.models.vlm.LLMStage`` over this model's modules).

Parameters keep transformers' names (``model.vision_tower...``, ``model.language_model...``,
``lm_head.weight``), so gradients compare with transformers' model tensor by tensor. The model is
built on the meta device and a rank reads only its stages' tensors from the folder's safetensors
(transformers 5 writes the legacy names ``vision_tower...``, ``language_model.model...``,
``language_model.lm_head...``, ``image_newline``; both spellings are read).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn

from entrain.core.errors import ConfigError
from entrain.models.families.composition import vlm
from entrain.models.families.composition.attention import PACKED_ATTENTION
from entrain.models.families.llava_onevision.spec import check_supported as check_supported_config

__all__ = [
    "OneVisionModel",
    "TileBatch",
    "EncoderStage",
    "LLMStage",
    "read_config",
    "build_model",
    "build_stage",
    "set_trainable",
    "checkpoint_keys",
    "hf_config_of",
    "tiles_to_rows",
    "rows_to_tiles",
    "FAMILY",
]

FAMILY = "llava_onevision"

VISION = "model.vision_tower."
PROJECTOR = "model.multi_modal_projector."
NEWLINE = "model.image_newline"
LANGUAGE = "model.language_model."


def read_config(folder: str):
    """The folder's ``LlavaOnevisionConfig`` (ConfigError naming the file if it is not one we train)."""
    from transformers import AutoConfig

    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no config.json")
    try:
        cfg = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: transformers cannot read it ({e})") from None
    if cfg.model_type != "llava_onevision":
        raise ConfigError(f"{path}: model_type {cfg.model_type!r} is not llava_onevision")
    check_supported(cfg, path)
    return cfg


def hf_config_of(shape):
    """A ``LlavaOnevisionConfig`` of a preset's ``OneVisionShape`` (image token: the last vocabulary id)."""
    from transformers import LlavaOnevisionConfig

    v, llm, rules = shape.vision, shape.llm, shape.rules
    vision = dict(model_type="siglip_vision_model", hidden_size=v.hidden_size, intermediate_size=v.intermediate_size,
                  num_hidden_layers=v.num_layers, num_attention_heads=v.num_heads, image_size=v.image_size,
                  patch_size=v.patch_size, vision_use_head=False)  # fmt: skip
    text = dict(model_type="qwen2", hidden_size=llm.hidden_size, intermediate_size=llm.intermediate_size,
                num_hidden_layers=llm.num_hidden_layers, num_attention_heads=llm.num_attention_heads,
                num_key_value_heads=llm.num_key_value_heads, vocab_size=llm.vocab_size, rope_theta=llm.rope_theta,
                rms_norm_eps=llm.rms_norm_eps, tie_word_embeddings=False)  # fmt: skip
    return LlavaOnevisionConfig(
        vision_config=vision, text_config=text, image_token_index=llm.vocab_size - 1,
        video_token_index=llm.vocab_size - 2, image_grid_pinpoints=[list(p) for p in rules.grid_pinpoints],
        vision_aspect_ratio=f"anyres_max_{rules.max_tiles}", multimodal_projector_bias=shape.projector_bias,
    )  # fmt: skip


def check_supported(cfg, where: str = "config") -> None:
    """Refuse what the stages do not reproduce exactly (``spec.check_supported`` on the config's dict)."""
    check_supported_config(cfg.to_dict(), where)
    if not isinstance(cfg.vision_feature_layer, int):
        raise ConfigError(f"{where}: vision_feature_layer must be one layer, not {cfg.vision_feature_layer}")


def feature_layers(cfg) -> int:
    """SigLIP encoder layers whose output the projector reads (``vision_feature_layer``)."""
    total = cfg.vision_config.num_hidden_layers
    k = cfg.vision_feature_layer
    k = k if k >= 0 else total + 1 + k
    if not 0 <= k <= total:
        raise ConfigError(f"vision_feature_layer {cfg.vision_feature_layer} outside 0..{total}")
    return k


class OneVisionModel(nn.Module):
    """Holds transformers' model (``.hf``); trained with an untied lm_head (embedding and lm_head may
    sit on different stages)."""

    entrain_family = FAMILY

    def __init__(self, cfg, *, meta: bool, run_cfg=None):
        super().__init__()
        self.cfg = run_cfg
        """The family's run config (``family.OneVisionConfig``; None for a bare model)."""
        from transformers import LlavaOnevisionForConditionalGeneration

        check_supported(cfg)
        cfg.tie_word_embeddings = False
        cfg.text_config.tie_word_embeddings = False
        cfg.text_config._attn_implementation = PACKED_ATTENTION
        self.config = cfg
        self.num_feature_layers = feature_layers(cfg)
        if not meta:
            self.hf = LlavaOnevisionForConditionalGeneration(cfg)
            return
        with torch.device("meta"):
            self.hf = LlavaOnevisionForConditionalGeneration(cfg)
        emb = self.hf.model.vision_tower.embeddings
        emb.position_ids = torch.arange(emb.num_positions).expand((1, -1))
        lm = self.hf.model.language_model
        lm.rotary_emb = type(lm.rotary_emb)(config=cfg.text_config)

    def layer_names(self, component: str) -> list[str]:
        if component == "encoder":
            return ["embeddings", *(f"layers.{i}" for i in range(self.num_feature_layers)), "merger"]
        if component == "llm":
            layers = [f"layers.{i}" for i in range(self.config.text_config.num_hidden_layers)]
            return ["embed_tokens", *layers, "norm", "lm_head", "loss"]
        raise ConfigError(f"unknown component {component!r} (encoder or llm)")


def build_model(
    folder: str | None = None,
    *,
    config=None,
    seed: int = 0,
    stages: Sequence[tuple[str, int, int]] | None = None,
    run_cfg=None,
) -> OneVisionModel:
    """The model of checkpoint ``folder`` on the meta device with only the parameters of ``stages``
    ((component, first, end); None: all) read as float32 CPU tensors; or, from ``config`` alone, a
    random float32 model from ``seed``."""
    if folder is None:
        if config is None:
            raise ConfigError("build_model needs a checkpoint folder or a config")
        torch.manual_seed(seed)
        model = OneVisionModel(config, meta=False, run_cfg=run_cfg)
        model.hf.lm_head.weight.data.copy_(model.hf.model.language_model.embed_tokens.weight.data)
        return model
    model = OneVisionModel(read_config(folder), meta=True, run_cfg=run_cfg)
    if stages is None:
        stages = [(c, 0, len(model.layer_names(c))) for c in ("encoder", "llm")]
    names = [n for c, a, b in stages for n, _ in build_stage(model, c, a, b).owned_parameters()]
    materialize(model, names, folder)
    return model


def checkpoint_keys(name: str) -> list[str]:
    """The tensor names parameter ``name`` may have in a checkpoint (transformers 5's and legacy)."""
    if name.startswith(VISION):
        rest = name[len(VISION) :]
        return [name, f"vision_tower.{rest}", f"vision_tower.vision_model.{rest}"]
    if name.startswith(LANGUAGE):
        rest = name[len(LANGUAGE) :]
        return [name, f"language_model.model.{rest}", f"language_model.{rest}"]
    if name == "lm_head.weight":
        return [name, "language_model.lm_head.weight", *checkpoint_keys(f"{LANGUAGE}embed_tokens.weight")]
    return [name, name.removeprefix("model.")]


def materialize(model: OneVisionModel, names: Iterable[str], folder: str) -> None:
    """Replace the meta parameters ``names`` by the folder's tensors (float32, CPU)."""
    from entrain.models.families.composition.hf_checkpoint import SafetensorsFolder, check_unexpected

    reader = SafetensorsFolder(folder)
    names = list(names)
    if names:  # the whole config.json's model: every tensor of the folder has a parameter
        every = [
            next((k for k in checkpoint_keys(n) if k in reader), None) for n, _ in model.hf.named_parameters()
        ]
        check_unexpected(reader, [k for k in every if k is not None])
    keys = {}
    for name in names:
        found = [k for k in checkpoint_keys(name) if k in reader]
        if not found:
            raise ConfigError(
                f"{folder}: the checkpoint has no tensor for {name} ({checkpoint_keys(name)[1]})"
            )
        keys[name] = found[0]
    tensors = reader.read(set(keys.values()))
    for name, key in keys.items():
        path, _, leaf = name.rpartition(".")
        owner = model.hf.get_submodule(path)
        old = getattr(owner, leaf)
        t = tensors[key]
        if tuple(t.shape) != tuple(old.shape):
            raise ConfigError(
                f"{folder}: {key} has shape {tuple(t.shape)}, config.json implies {tuple(old.shape)}"
            )
        setattr(owner, leaf, nn.Parameter(t.to(torch.float32), requires_grad=old.requires_grad))


def set_trainable(
    model: OneVisionModel, *, encoder: bool = True, merger: bool = True, llm: bool = True
) -> None:
    """Freeze or unfreeze the SigLIP tower, the projector + image_newline, the language model."""
    for name, p in model.hf.named_parameters():
        if name.startswith(VISION):
            p.requires_grad_(encoder)
        elif name.startswith(PROJECTOR) or name == NEWLINE:
            p.requires_grad_(merger)
        else:
            p.requires_grad_(llm)


# --------------------------------------------------------------------------------------------------
# Encoder stages


@dataclass
class TileBatch:
    """The packed images of a (sub-)microbatch: ``pixel_values [n, 3, S, S]`` every image's tiles in
    image order (base tile first, then the grid row by row); ``image_sizes [images, 2]`` (height,
    width) of the original images; ``tiles_per_image`` (1 for an image among several in its sample)."""

    pixel_values: torch.Tensor
    image_sizes: torch.Tensor
    tiles_per_image: tuple[int, ...]


def tiles_to_rows(pixel_values: torch.Tensor, patch_px: int) -> torch.Tensor:
    """``[n, C, S, S]`` tiles -> ``[n * side**2, C * patch_px**2]`` patch rows (tile, row, column order;
    each row ``(channel, dy, dx)``), what ``ModelFamily.encoder_input_width`` counts; the pixels past
    the last whole patch (384 = 27 x 14 + 6) are dropped, as SigLIP's patch convolution drops them."""
    n, c, size, _ = pixel_values.shape
    side = size // patch_px
    x = pixel_values[:, :, : side * patch_px, : side * patch_px]
    x = x.reshape(n, c, side, patch_px, side, patch_px).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(n * side * side, c * patch_px * patch_px)


def rows_to_tiles(rows: torch.Tensor, num_tiles: int, channels: int, patch_px: int) -> torch.Tensor:
    """Inverse of ``tiles_to_rows``: ``[n, C, side * patch_px, side * patch_px]`` tiles."""
    side = int(round((rows.shape[0] // num_tiles) ** 0.5))
    x = rows.reshape(num_tiles, side, side, channels, patch_px, patch_px).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(num_tiles, channels, side * patch_px, side * patch_px)


def _owned(prefix: str, parts: Iterable[tuple[str, nn.Module]]) -> list[tuple[str, nn.Parameter]]:
    return [(f"{prefix}{n}.{pn}", p) for n, m in parts for pn, p in m.named_parameters()]


def tile_batch_of(grid: torch.Tensor) -> TileBatch:
    """The ``TileBatch`` (without pixels) of the seam's ``[images, 5]`` grid rows."""
    if grid.dim() != 2 or grid.shape[1] != 5:
        raise ValueError(
            f"{FAMILY} encoder grid must be [images, 5] (tiles, h, w, H, W), got {tuple(grid.shape)}"
        )
    return TileBatch(None, grid[:, 3:5].cpu(), tuple(int(t) for t in grid[:, 0].tolist()))


class EncoderStage(nn.Module):
    """Encoder layers ``[first, end)`` of ``[embeddings, layers..., merger]``.

    Input: ``TileBatch.pixel_values`` or its ``tiles_to_rows`` ``[n * P, C * patch**2]`` (first stage),
    or ``[n * P, D]`` states. Output ``[n * P, D]``
    or, after the merger, ``[M, H]`` LLM image tokens in image order.
    """

    entrain_family = FAMILY

    def __init__(self, model: OneVisionModel, first: int, end: int):
        super().__init__()
        self.tower = model.hf.model.vision_tower
        self.projector = model.hf.model.multi_modal_projector
        object.__setattr__(self, "outer", model.hf.model)  # pack_image_features; no submodule
        k = model.num_feature_layers
        self.first, self.end = first, end
        self.has_embeddings = first == 0
        self.layer_ids = list(range(max(first, 1) - 1, min(end, k + 1) - 1))
        self.has_merger = end == k + 2
        if self.has_merger:  # the stage's own submodule: FSDP shards and reduces the stage's module tree
            self.newline = nn.Module()
            self.newline.image_newline = model.hf.model.image_newline

    def owned_parameters(self) -> list[tuple[str, nn.Parameter]]:
        tower = self.tower
        parts: list[tuple[str, nn.Module]] = []
        if self.has_embeddings:
            parts.append(("embeddings", tower.embeddings))
        parts += [(f"encoder.layers.{i}", tower.encoder.layers[i]) for i in self.layer_ids]
        owned = _owned(VISION, parts)
        if self.has_merger:
            owned += [(f"{PROJECTOR}{n}", p) for n, p in self.projector.named_parameters()]
            owned.append((NEWLINE, self.newline.image_newline))
        return owned

    def move_to(self, device: torch.device) -> None:
        for _, p in self.owned_parameters():
            p.data = p.data.to(device)
        emb = self.tower.embeddings
        emb.position_ids = emb.position_ids.to(device)

    def forward(self, x: torch.Tensor, tiles: TileBatch | torch.Tensor) -> torch.Tensor:
        """``tiles``: a ``TileBatch``, or the seam's ``[images, 5]`` grid rows ``(tiles, side, side, H,
        W)`` (``image_grids`` + ``image_extras``)."""
        if isinstance(tiles, torch.Tensor):
            tiles = tile_batch_of(tiles)
        tower = self.tower
        n = sum(tiles.tiles_per_image)
        if self.has_embeddings:
            if x.dim() == 2:  # patch rows (the seam's encoder input) back to tiles
                cfg = tower.config
                x = rows_to_tiles(x, n, cfg.num_channels, cfg.patch_size)
            x = tower.embeddings(x)
        x = x.view(n, -1, x.shape[-1])
        for i in self.layer_ids:
            x = tower.encoder.layers[i](x, None)
        if not self.has_merger:
            return x.reshape(-1, x.shape[-1])
        feats = self.projector(x).split(list(tiles.tiles_per_image))
        packed, _ = self.outer.pack_image_features(
            feats,
            tiles.image_sizes,
            image_newline=self.newline.image_newline,
            vision_aspect_ratio=self.outer.config.vision_aspect_ratio,
        )
        return torch.cat(packed)


# --------------------------------------------------------------------------------------------------
# LLM stages


class LLMStage(vlm.LLMStage):
    """LLM layers ``[first, end)`` of ``[embed_tokens, layers..., norm, lm_head, loss]`` of the Qwen2
    language model (``entrain.models.vlm.LLMStage``'s packed forward over this model's modules)."""

    entrain_family = FAMILY
    """Not the base class's: the runtime asks this family (recompute, FSDP units) for the stage."""

    def __init__(self, model: OneVisionModel, first: int, end: int):
        parts = nn.Module()  # the shape vlm.LLMStage reads: .model (embed_tokens, layers, norm), .lm_head
        parts.model, parts.lm_head = model.hf.model.language_model, model.hf.lm_head
        super().__init__(SimpleNamespace(llm=parts), first, end)

    def owned_parameters(self) -> list[tuple[str, nn.Parameter]]:
        inner = self.llm.model
        parts: list[tuple[str, nn.Module]] = []
        if self.has_embed:
            parts.append(("embed_tokens", inner.embed_tokens))
        parts += [(f"layers.{i}", inner.layers[i]) for i in self.layer_ids]
        if self.has_norm:
            parts.append(("norm", inner.norm))
        owned = _owned(LANGUAGE, parts)
        if self.has_lm_head:
            owned.append(("lm_head.weight", self.llm.lm_head.weight))
        return owned


def build_stage(model: OneVisionModel, component: str, first: int, end: int) -> EncoderStage | LLMStage:
    """The stage module of layers ``[first, end)`` of ``component`` (``encoder`` or ``llm``)."""
    n = len(model.layer_names(component))
    if not 0 <= first < end <= n:
        raise ConfigError(f"{component} stage layers [{first}, {end}) outside 0..{n}")
    if component == "encoder":
        return EncoderStage(model, first, end)
    return LLMStage(model, first, end)
