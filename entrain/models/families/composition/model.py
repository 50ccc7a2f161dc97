"""Build the vision-language model from Hugging Face configs and cut it into pipeline stages.

Shape legend: ``N`` ViT patches, ``M`` merged image tokens (``N / 4``), ``T`` packed LLM tokens,
``H`` LLM hidden size, ``V`` vocabulary, ``P`` patch values (1,176).

The model is built once from a seed (or loaded from a local weights folder), so every rank that builds
it holds the same weights as a single-process reference. ``build_stage`` keeps references to the
submodules of a layer range; parameter names stay the full model's names (``named_parameters`` of the
stage module is keyed by them) so gradients can be compared tensor by tensor.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.vision_utils import (
    get_vision_cu_seqlens,
    get_vision_position_ids,
    get_vision_window_index,
)

from entrain.core.errors import ConfigError
from entrain.models.batch import LLMBatch
from entrain.models.families.composition.config import FAMILY, VLMConfig
from entrain.models.families.packed_attention import PACKED_ATTENTION, use_varlen_vision_attention

__all__ = [
    "VLM",
    "build_vlm",
    "EncoderStage",
    "LLMStage",
    "LLMBatch",
    "build_stage",
    "set_trainable",
    "checkpoint_parts",
    "fuse_parts",
]


def vision_hf_config(cfg: VLMConfig) -> Qwen2_5_VLVisionConfig:
    return Qwen2_5_VLVisionConfig(**cfg.vision.hf_kwargs())


def llm_hf_config(cfg: VLMConfig) -> LlamaConfig:
    hf = LlamaConfig(**{**cfg.llm.hf_kwargs(), "tie_word_embeddings": False})
    hf._attn_implementation = PACKED_ATTENTION
    return hf


class VLM(nn.Module):
    """Vision tower (its merger projects to the LLM width) + Llama-structured causal LM.

    A preset is built on the CPU from its seed; a stock model (``cfg.vision_dir`` / ``cfg.llm_dir``)
    on the meta device, its parameters loaded later by ``entrain.models.families.composition.hf_checkpoint.materialize``.
    """

    entrain_family = FAMILY

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.is_stock:
            from entrain.models.families.composition.hf_checkpoint import build_stock_llm, build_stock_vision

            # the depths are the arch's (equal to config.json's but for the profiler's small model)
            blocks = (cfg.vision.depth, cfg.vision.fullatt_block_indexes)
            self.vision = build_stock_vision(cfg.vision_dir, blocks)
            num_layers = cfg.llm.num_hidden_layers
            self.llm = build_stock_llm(cfg.llm_dir, PACKED_ATTENTION, cfg.llm.vocab_size, num_layers)
            use_varlen_vision_attention(self.vision)
            return
        self.vision = Qwen2_5_VisionTransformerPretrainedModel(vision_hf_config(cfg))
        use_varlen_vision_attention(self.vision)
        self.llm = LlamaForCausalLM(llm_hf_config(cfg))
        if cfg.llm.tie_word_embeddings:  # untied copy: embedding and lm_head may sit on different stages
            self.llm.lm_head.weight.data.copy_(self.llm.model.embed_tokens.weight.data)


def build_vlm(
    cfg: VLMConfig,
    *,
    seed: int = 0,
    weights_dir: str | None = None,
    dtype: torch.dtype = torch.float32,
    stages: list[tuple[str, int, int]] | None = None,
) -> VLM:
    """Random init from ``seed``, or the weights in ``weights_dir`` (``vision/`` and ``llm/`` Hugging Face
    folders, or one ``model.safetensors`` / ``model.pt`` state dict of this ``VLM``).

    A stock model is built on the meta device and only the parameters of ``stages`` ((component,
    first, end) layer ranges; None: all) are read from its checkpoint folders; the rest stay on meta.
    """
    torch.manual_seed(seed)
    model = VLM(cfg)
    if cfg.is_stock:
        from entrain.models.families.composition.hf_checkpoint import materialize

        if weights_dir is not None:
            raise ConfigError("--weights and --vision-model/--llm-model both give the weights: pass one")
        if stages is None:
            stages = [(c, 0, len(cfg.layer_names(c))) for c in ("encoder", "llm")]
        names = [n for c, a, b in stages for n, _ in build_stage(model, c, a, b).owned_parameters()]
        materialize(model, names, vision_dir=cfg.vision_dir, llm_dir=cfg.llm_dir, strict=_whole(cfg))
        return model
    if weights_dir is not None:
        _load_weights(model, weights_dir)
    return model.to(dtype)


def _whole(cfg: VLMConfig) -> bool:
    """The stock folders' own depths (not the profiler's reduced model): their every tensor is used."""
    from entrain.models.families.composition.spec import llm_arch, vision_arch

    full = vision_arch(cfg.vision_dir).depth, llm_arch(cfg.llm_dir).num_hidden_layers
    return (cfg.vision.depth, cfg.llm.num_hidden_layers) == full


def _load_weights(model: VLM, weights_dir: str) -> None:
    if not os.path.isdir(weights_dir):
        raise ConfigError(f"weights folder {weights_dir!r} does not exist")
    flat = [os.path.join(weights_dir, f) for f in ("model.safetensors", "model.pt")]
    found = [p for p in flat if os.path.exists(p)]
    if found:
        if found[0].endswith(".safetensors"):
            from safetensors.torch import load_file

            from entrain.core.safetensors_header import safetensors_problem

            problem = safetensors_problem(found[0])
            if problem is not None:
                raise ConfigError(f"{found[0]}: {problem}")
            state = load_file(found[0])
        else:
            state = torch.load(found[0], map_location="cpu", weights_only=True)
        model.load_state_dict(state)
        return
    for part, module in (("vision", model.vision), ("llm", model.llm)):
        sub = os.path.join(weights_dir, part)
        if not os.path.isdir(sub):
            raise ConfigError(f"weights folder {weights_dir!r} has neither model.safetensors nor {part}/")
        # only the weights are read: a plain copy of the config (transformers would look for a flash
        # kernel package behind the vision tower's "flash"-named attention, entrain_flash_windows)
        config = copy.deepcopy(module.config)
        config._attn_implementation = "sdpa"
        loaded = type(module).from_pretrained(sub, config=config)
        state = loaded.state_dict()
        if part == "llm" and "lm_head.weight" not in state:  # tied checkpoint: untie
            state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
        module.load_state_dict(state)


def set_trainable(model: VLM, *, encoder: bool = True, merger: bool = True, llm: bool = True) -> None:
    """Freeze or unfreeze components (docs/design.md §1.3: frozen encoder or LLM)."""
    for name, p in model.vision.named_parameters():
        p.requires_grad_(merger if name.startswith("merger.") else encoder)
    for p in model.llm.parameters():
        p.requires_grad_(llm)


# --------------------------------------------------------------------------------------------------
# Encoder stages


@dataclass
class VisionGeometry:
    """Per-call index tensors of a packed set of images (what every encoder stage recomputes)."""

    window_index: torch.Tensor | None
    """None for Qwen2-VL's tower (no window permutation)."""
    cu_seqlens: torch.Tensor
    cu_window_seqlens: torch.Tensor
    """Image and window bounds, on the host (the attention splits by them or copies them over)."""
    position_embeddings: tuple[torch.Tensor, torch.Tensor]
    max_seqlen: int = 0
    """Patches of the largest image (the varlen kernel's bound)."""
    max_window_seqlen: int = 0
    """Patches of the largest window."""


GEOMETRY_CACHE_SIZE = 8
"""Image grid lists whose index tensors an encoder stage keeps (each a few tensors of its patches)."""


def _geometry_key(grid_thw: torch.Tensor, like: torch.Tensor) -> tuple:
    """The cache key of a geometry: the images' grids (host values), the device, dtype and autocast."""
    autocast = torch.is_autocast_enabled(like.device.type)
    return (tuple(map(tuple, grid_thw.tolist())), like.device, like.dtype, autocast)


def _remembered(cache: dict, key: tuple, make):
    """``cache[key]``, made by ``make()`` when absent; the least recently used entries go beyond
    ``GEOMETRY_CACHE_SIZE``."""
    value = cache.pop(key, None)
    if value is None:
        value = make()
    cache[key] = value  # most recent last
    while len(cache) > GEOMETRY_CACHE_SIZE:
        del cache[next(iter(cache))]
    return value


def _max_len(bounds: torch.Tensor) -> int:
    """The longest span of host ``bounds`` (0 for none)."""
    return int((bounds[1:] - bounds[:-1]).max()) if len(bounds) > 1 else 0


class EncoderStage(nn.Module):
    """Encoder layers ``[first, end)`` of ``[patch_embed, blocks..., merger]``.

    Input: ``[N, P]`` patches (first stage) or ``[N, hidden]`` window-permuted states; plus
    ``grid_thw [images, 3]``. Output: window-permuted ``[N, hidden]`` or, after the merger,
    ``[M, H]`` merged tokens in image order.
    """

    entrain_family = FAMILY

    def __init__(self, model: VLM, first: int, end: int):
        super().__init__()
        vis = model.vision
        depth = len(vis.blocks)
        self.first, self.end = first, end
        self.vis = vis
        self.block_ids = [i - 1 for i in range(max(first, 1), min(end, depth + 1))]
        self.has_patch_embed = first == 0
        self.has_merger = end == depth + 2
        self.prefix = "vision."
        self.windowed = hasattr(vis, "window_size")
        """Qwen2.5-VL's window attention (window-permuted states); Qwen2-VL attends fully everywhere."""
        self._geometries: dict[tuple, VisionGeometry | torch.Tensor] = {}
        """Recent geometries (and merger orders) by image grids, oldest first (``GEOMETRY_CACHE_SIZE``)."""

    def owned_parameters(self) -> list[tuple[str, nn.Parameter]]:
        parts: list[tuple[str, nn.Module]] = []
        if self.has_patch_embed:
            parts.append(("patch_embed", self.vis.patch_embed))
        parts += [(f"blocks.{i}", self.vis.blocks[i]) for i in self.block_ids]
        if self.has_merger:
            parts.append(("merger", self.vis.merger))
        return [(f"{self.prefix}{n}.{pn}", p) for n, m in parts for pn, p in m.named_parameters()]

    def move_to(self, device: torch.device) -> None:
        """Move only what this stage owns (and the rotary tables) to ``device``."""
        for _, p in self.owned_parameters():
            p.data = p.data.to(device)
        self.vis.rotary_pos_emb.to(device)

    def geometry(self, grid_thw: torch.Tensor, like: torch.Tensor) -> VisionGeometry:
        """The index tensors of ``grid_thw``'s images, remembered per image grid list (and ``like``'s
        device and dtype): microbatches of same-sized images (a resize cap) reuse them."""
        key = _geometry_key(grid_thw, like)
        return _remembered(self._geometries, key, lambda: self._compute_geometry(grid_thw, like))

    def _compute_geometry(self, grid_thw: torch.Tensor, like: torch.Tensor) -> VisionGeometry:
        vis = self.vis
        pos_ids = get_vision_position_ids(grid_thw, vis.spatial_merge_size)
        # the attention bounds stay on the host: the per-window attention splits by them (.tolist())
        # and the varlen kernel takes their maximum, which on a GPU would wait for the device
        grid_host = grid_thw.cpu()
        cu_seqlens = get_vision_cu_seqlens(grid_host)
        n = int(cu_seqlens[-1])
        max_len = _max_len(cu_seqlens)
        if not self.windowed:
            emb = vis.rotary_pos_emb(like.new_empty((n, vis.config.embed_dim)), pos_ids.to(like.device))
            return VisionGeometry(None, cu_seqlens, cu_seqlens, emb, max_len, max_len)
        window_index, cu_window = self._window_index(grid_host)
        dummy = like.new_empty((n, vis.config.hidden_size))
        emb = vis.rotary_pos_emb(dummy, pos_ids.to(like.device))
        window_index = window_index.to(like.device)
        emb = tuple(vis.permute_input_for_window_attn(e, window_index, seq_len=n) for e in emb)
        return VisionGeometry(window_index, cu_seqlens, cu_window, emb, max_len, _max_len(cu_window))

    def _window_index(self, grid_host: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        vis = self.vis
        return get_vision_window_index(
            grid_host,
            spatial_merge_size=vis.spatial_merge_size,
            window_size=vis.window_size,
            patch_size=vis.patch_size,
        )

    def _image_order(self, grid_thw: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """The permutation from window order back to image order (what the merger alone needs)."""
        key = ("image_order", *_geometry_key(grid_thw, like))
        return _remembered(
            self._geometries,
            key,
            lambda: torch.argsort(self._window_index(grid_thw.cpu())[0].to(like.device)),
        )

    def forward(self, x: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        vis = self.vis
        if not self.has_patch_embed and not self.block_ids:  # the merger alone: no rotary, no bounds
            x = vis.merger(x)
            return x[self._image_order(grid_thw, x)] if self.windowed else x
        geo = self.geometry(grid_thw, x)
        if self.has_patch_embed:
            x = vis.patch_embed(x)
            if self.windowed:
                x = vis.permute_input_for_window_attn(x, geo.window_index, seq_len=x.shape[0])
        full_blocks = vis.fullatt_block_indexes if self.windowed else range(len(vis.blocks))
        for i in self.block_ids:
            full = i in full_blocks
            x = vis.blocks[i](
                x,
                cu_seqlens=geo.cu_seqlens if full else geo.cu_window_seqlens,
                max_seqlen=geo.max_seqlen if full else geo.max_window_seqlen,
                position_embeddings=geo.position_embeddings,
            )
        if self.has_merger:
            x = vis.merger(x)
            if self.windowed:
                x = x[torch.argsort(geo.window_index)]
        return x


# --------------------------------------------------------------------------------------------------
# LLM stages


class LLMStage(nn.Module):
    """LLM layers ``[first, end)`` of ``[embed_tokens, layers..., norm, lm_head, loss]``.

    Input: image features ``[M, H]`` (first stage), ``[1, T, H]`` hidden states, or ``[n, V]``
    logits at label positions. Output: ``[1, T, H]``, ``[n, V]`` logits, or the scalar loss
    ``sum(token CE) * loss_scale``.
    """

    entrain_family = FAMILY

    def __init__(self, model: VLM, first: int, end: int):
        super().__init__()
        llm = model.llm
        num_layers = len(llm.model.layers)
        self.first, self.end = first, end
        self.llm = llm
        self.has_embed = first == 0
        self.layer_ids = [i - 1 for i in range(max(first, 1), min(end, num_layers + 1))]
        self.has_norm = first <= num_layers + 1 < end
        self.has_lm_head = first <= num_layers + 2 < end
        self.has_loss = end == num_layers + 4

    def owned_parameters(self) -> list[tuple[str, nn.Parameter]]:
        inner = self.llm.model
        parts: list[tuple[str, nn.Module]] = []
        if self.has_embed:
            parts.append(("model.embed_tokens", inner.embed_tokens))
        parts += [(f"model.layers.{i}", inner.layers[i]) for i in self.layer_ids]
        if self.has_norm:
            parts.append(("model.norm", inner.norm))
        if self.has_lm_head:
            parts.append(("lm_head", self.llm.lm_head))
        return [(f"llm.{n}.{pn}", p) for n, m in parts for pn, p in m.named_parameters()]

    def move_to(self, device: torch.device) -> None:
        """Move only what this stage owns (and the rotary tables) to ``device``."""
        for _, p in self.owned_parameters():
            p.data = p.data.to(device)
        self.llm.model.rotary_emb.to(device)

    def forward(self, x: torch.Tensor | None, batch: LLMBatch) -> torch.Tensor:
        inner = self.llm.model
        if self.has_embed:  # [1, T, H] as made, not a view: split backward detaches a stage's output in place
            h = inner.embed_tokens(batch.input_ids.unsqueeze(0))
            if batch.image_positions.numel():
                row = torch.zeros_like(batch.image_positions)
                h = h.index_put((row, batch.image_positions), x.to(h.dtype))
            x = h
        if self.layer_ids:  # [T] -> [1, T]; M-RoPE's [3, T] -> [3, 1, T]
            pos = batch.position_ids.unsqueeze(-2)
            emb = inner.rotary_emb(x, pos)
            for i in self.layer_ids:
                x = inner.layers[i](
                    x, position_ids=pos, position_embeddings=emb, entrain_seq_lens=batch.seq_lens
                )
        if self.has_norm:
            x = inner.norm(x)
        if self.has_lm_head:
            x = self.llm.lm_head(x[0, batch.label_positions])
        if self.has_loss:
            x = F.cross_entropy(x.float(), batch.targets, reduction="sum") * batch.loss_scale
        return x


def build_stage(model: VLM, component: str, first: int, end: int) -> EncoderStage | LLMStage:
    """The stage module of layers ``[first, end)`` of ``component`` (``encoder`` or ``llm``)."""
    n = len(model.cfg.layer_names(component))
    if not 0 <= first < end <= n:
        raise ConfigError(f"{component} stage layers [{first}, {end}) outside 0..{n}")
    if component == "encoder":
        return EncoderStage(model, first, end)
    return LLMStage(model, first, end)


# --------------------------------------------------------------------------------------------------
# Checkpoint names

_QKV = ".attn.qkv."


def checkpoint_parts(name: str, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The checkpoint names of parameter ``name`` (or of its optimizer state ``t``): a vision
    attention's fused ``attn.qkv`` weight or bias as its q, k and v thirds (views), under the names a
    tensor-parallel run's split module gives them (``attn.qkv.q.weight`` ...), so checkpoints of TP
    and non-TP runs hold the same tensors; a 0-dim state (AdamW's step) is shared by the parts;
    everything else keeps its name."""
    head, sep, leaf = name.rpartition(_QKV)
    if not sep or leaf not in ("weight", "bias"):
        return [(name, t)]
    if type(t) is not torch.Tensor and not isinstance(t, nn.Parameter):  # a DTensor's thirds are no views
        raise TypeError(f"{name}: split the fused qkv before sharding it (entrain.runtime.parallelize)")
    parts = t.chunk(3, dim=0) if t.dim() else (t, t, t)
    return [(f"{head}{_QKV}{p}.{leaf}", c) for p, c in zip("qkv", parts)]


def fuse_parts(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of ``checkpoint_parts`` over whole parameters: ``attn.qkv.{q,k,v}.X`` -> ``attn.qkv.X``."""
    out: dict[str, torch.Tensor] = {}
    for name, t in params.items():
        head, sep, rest = name.rpartition(_QKV)
        part, _, leaf = rest.partition(".")
        if sep and part in ("q", "k", "v") and leaf in ("weight", "bias"):
            if part == "q":
                out[f"{head}{_QKV}{leaf}"] = torch.cat([params[f"{head}{_QKV}{p}.{leaf}"] for p in "qkv"])
            continue
        out[name] = t
    return out
