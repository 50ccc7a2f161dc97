"""What the tiled whole-checkpoint families share at run time (torch): a transformers
``...ForConditionalGeneration`` laid out as LLaVA's — ``model.vision_tower`` (a ViT that runs each image
tile as its own sequence), ``model.multi_modal_projector``, ``model.language_model``, ``lm_head`` — cut
into Entrain stages. InternVL and LLaVA-OneVision build on it; each family's ``model`` module adds its
tower's layer names, its merger and its checks.

* ``TiledModel``: holds transformers' model (``.hf``), untied, with the packed attention, built on the
  meta device for a checkpoint; ``num_feature_layers`` tower layers feed the merger.
* ``build_stage`` / ``load_stages``: the stage modules of a layer range, and a checkpoint's tensors of
  the stages a rank runs (``materialize``: transformers 5's names and the legacy ones).
* ``TowerStage`` (encoder layers ``[embeddings, layers..., merger]``) and ``LLMStage`` (``[embed_tokens,
  layers..., norm, lm_head, loss]``, the composition's packed forward over ``model.language_model``).
* ``tiles_to_rows`` / ``rows_to_tiles``: the seam's encoder input rows of tiles and back.

Parameters keep transformers' names, so gradients compare with transformers' model tensor by tensor.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from types import SimpleNamespace

import torch
from torch import nn

from entrain.core.errors import ConfigError
from entrain.models.families.base import COMPONENTS
from entrain.models.families.composition.model import LLMStage as CompositionLLMStage
from entrain.models.families.packed_attention import PACKED_ATTENTION

__all__ = [
    "VISION",
    "PROJECTOR",
    "LANGUAGE",
    "read_hf_config",
    "TiledModel",
    "build_stage",
    "load_stages",
    "checkpoint_keys",
    "materialize",
    "owned",
    "tiles_to_rows",
    "rows_to_tiles",
    "TowerStage",
    "LLMStage",
    "llm_profile_input",
]

VISION = "model.vision_tower."
PROJECTOR = "model.multi_modal_projector."
LANGUAGE = "model.language_model."


def read_hf_config(folder: str, model_type: str):
    """The folder's transformers config (``AutoConfig``); ConfigError naming the file when there is
    none, transformers cannot read it, or its ``model_type`` is not ``model_type``."""
    from transformers import AutoConfig

    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no config.json")
    try:
        cfg = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: transformers cannot read it ({e})") from None
    if cfg.model_type != model_type:
        raise ConfigError(f"{path}: model_type {cfg.model_type!r} is not {model_type}")
    return cfg


class TiledModel(nn.Module):
    """Holds transformers' model (``.hf``, of ``hf_class``); trained with an untied lm_head (embedding
    and lm_head may sit on different stages). ``feature_layers``: the tower layers whose output the
    merger reads."""

    def __init__(self, cfg, hf_class, *, meta: bool, run_cfg=None, feature_layers: int):
        super().__init__()
        self.cfg = run_cfg
        """The family's run config (None for a bare model)."""
        cfg.tie_word_embeddings = False
        cfg.text_config.tie_word_embeddings = False
        cfg.text_config._attn_implementation = PACKED_ATTENTION
        self.config = cfg
        self.num_feature_layers = feature_layers
        if not meta:
            self.hf = hf_class(cfg)
            return
        with torch.device("meta"):
            self.hf = hf_class(cfg)
        self.on_meta()
        lm = self.hf.model.language_model
        lm.rotary_emb = type(lm.rotary_emb)(config=cfg.text_config)

    def on_meta(self) -> None:
        """Rebuild the buffers a meta-device build leaves empty (besides the LLM's rotary tables)."""

    def layer_names(self, component: str) -> list[str]:
        if component == "encoder":
            return ["embeddings", *(f"layers.{i}" for i in range(self.num_feature_layers)), "merger"]
        if component == "llm":
            layers = [f"layers.{i}" for i in range(self.config.text_config.num_hidden_layers)]
            return ["embed_tokens", *layers, "norm", "lm_head", "loss"]
        raise ConfigError(f"unknown component {component!r} (encoder or llm)")


def build_stage(
    model: TiledModel, component: str, first: int, end: int, encoder_stage: type, llm_stage: type
):
    """The stage module of layers ``[first, end)`` of ``component`` (``encoder``: ``encoder_stage``,
    ``llm``: ``llm_stage``)."""
    n = len(model.layer_names(component))
    if not 0 <= first < end <= n:
        raise ConfigError(f"{component} stage layers [{first}, {end}) outside 0..{n}")
    return (encoder_stage if component == "encoder" else llm_stage)(model, first, end)


def load_stages(model: TiledModel, folder: str, stages: Sequence[tuple[str, int, int]] | None, build) -> None:
    """Read the checkpoint ``folder``'s tensors of the parameters the stages ``(component, first,
    end)`` own (None: every stage), ``build(model, component, first, end)`` making each stage."""
    if stages is None:
        stages = [(c, 0, len(model.layer_names(c))) for c in COMPONENTS]
    names = [n for c, a, b in stages for n, _ in build(model, c, a, b).owned_parameters()]
    materialize(model, names, folder)


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


def materialize(model: TiledModel, names: Iterable[str], folder: str) -> None:
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


def owned(prefix: str, parts: Iterable[tuple[str, nn.Module]]) -> list[tuple[str, nn.Parameter]]:
    """``(prefix + part name + "." + parameter name, parameter)`` of every parameter of ``parts``."""
    return [(f"{prefix}{n}.{pn}", p) for n, m in parts for pn, p in m.named_parameters()]


def tiles_to_rows(pixel_values: torch.Tensor, patch_px: int) -> torch.Tensor:
    """``[n, C, S, S]`` tiles -> ``[n * side**2, C * patch_px**2]`` patch rows (tile, row, column order;
    each row ``(channel, dy, dx)``), what ``ModelFamily.encoder_input_width`` counts; the pixels past
    the last whole patch (384 = 27 x 14 + 6) are dropped, as a patch convolution drops them."""
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


class TowerStage(nn.Module):
    """Encoder layers ``[first, end)`` of ``[embeddings, layers..., merger]``: the tower, the projector
    and (not a submodule) transformers' outer model, whose merging code the merger calls. A family's
    stage adds ``owned_parameters``, ``forward`` and ``transformer_layers``."""

    def __init__(self, model: TiledModel, first: int, end: int):
        super().__init__()
        self.tower = model.hf.model.vision_tower
        self.projector = model.hf.model.multi_modal_projector
        object.__setattr__(self, "outer", model.hf.model)  # no submodule: FSDP must not wrap it
        k = model.num_feature_layers
        self.first, self.end = first, end
        self.has_embeddings = first == 0
        self.layer_ids = list(range(max(first, 1) - 1, min(end, k + 1) - 1))
        self.has_merger = end == k + 2

    def move_to(self, device: torch.device) -> None:
        for _, p in self.owned_parameters():
            p.data = p.data.to(device)


class LLMStage(CompositionLLMStage):
    """LLM layers ``[first, end)`` of ``[embed_tokens, layers..., norm, lm_head, loss]`` of
    ``model.language_model`` (the composition's packed forward over this model's modules)."""

    def __init__(self, model: TiledModel, first: int, end: int):
        parts = (
            nn.Module()
        )  # the shape the composition's LLMStage reads: .model (embed_tokens, layers, norm), .lm_head
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
        params = owned(LANGUAGE, parts)
        if self.has_lm_head:
            params.append(("lm_head.weight", self.llm.lm_head.weight))
        return params

    def transformer_layers(self) -> tuple[list[nn.Module], str]:
        """The decoder layers the stage runs, and the name of their attention sub-module."""
        return [self.llm.model.layers[i] for i in self.layer_ids], "self_attn"


def llm_profile_input(cfg, layer: int, tokens: int, device: torch.device, per_label: bool):
    """``ModelFamily.profile_input`` of an LLM layer: the composition's (one packed sample)."""
    from entrain.models.families.composition.profiling import llm_input

    view = SimpleNamespace(llm=cfg.shape.llm, llm_layer_names=cfg.layer_names("llm"))
    return llm_input(view, layer, tokens, device, per_label)
