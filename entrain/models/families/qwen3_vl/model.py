"""A whole Qwen3-VL checkpoint as Entrain pipeline stages.

The model is transformers' own ``Qwen3VLForConditionalGeneration`` built on the meta device; only the
parameters of a rank's stages are read from the folder's safetensors (float32, CPU), so parameter
names are transformers' (``model.visual.*``, ``model.language_model.*``, ``lm_head.weight``).

Stage messages are named parts (``dict[str, Tensor]``): ``"hidden"`` (patch states, image features,
LLM hidden states) and ``"deepstack_k"``, the ``k``-th DeepStack feature ``[M, H]`` (rows: the visual
tokens, in image order). The encoder stage holding tapped block ``deepstack_visual_indexes[k]`` runs
its DeepStack merger right after the block and emits the part; every later stage forwards it until
the LLM stage holding decoder layer ``k`` adds it to that layer's output at the visual positions (as
transformers' ``_deepstack_process``) and drops it. So any cut is allowed: inside the tower, between
the taps, between the LLM layers receiving the features.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch
from torch import nn

from entrain.core.errors import ConfigError
from entrain.models.families.composition.model import LLMStage
from entrain.models.families.packed_attention import PACKED_ATTENTION, use_varlen_vision_attention
from entrain.models.families.qwen2_vl.model import load_parameters, untie
from entrain.models.families.qwen3_vl.spec import MODEL_TYPES, deepstack_part, shape_of_config

__all__ = ["read_hf_config", "build_model", "build_stage", "layer_counts", "set_trainable", "untie", "HIDDEN",
           "VisionStage", "TextStage"]  # fmt: skip

VISION_PREFIX = "model.visual."
LLM_PREFIX = "model.language_model."
HIDDEN = "hidden"


def read_hf_config(folder: str, shape_of=shape_of_config):
    """Transformers' config of the Qwen3-VL checkpoint in ``folder`` (ConfigError otherwise; ``shape_of``:
    a variant's ``shape_of_config``, whose refusals apply)."""
    from transformers import AutoConfig

    from entrain.models.families.registry import read_config

    where = f"{folder}/config.json"
    shape_of(read_config(folder), where, "check")  # the family's refusals, naming the field
    try:
        return AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{where}: transformers cannot read it ({e})") from None


def model_class() -> type:
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration


def layer_counts(model: nn.Module) -> dict[str, int]:
    """``encoder`` = patch_embed + blocks + merger, ``llm`` = embed + layers + norm + lm_head + loss."""
    return {"encoder": len(model.model.visual.blocks) + 2, "llm": len(model.model.language_model.layers) + 4}


def build_model(folder: str, *, stages: Sequence[tuple[str, int, int]] | None = None, hf_config=None,
                strict: bool = True, cls: type | None = None, model_types=MODEL_TYPES) -> nn.Module:  # fmt: skip
    """The model of checkpoint ``folder`` on the meta device with the parameters of ``stages``
    (``(component, first, end)``; None: all) loaded as float32 CPU tensors. ``cls`` / ``model_types``:
    a variant's transformers class and ``model_type`` (Qwen3-VL-MoE; default Qwen3-VL's)."""
    config = hf_config if hf_config is not None else read_hf_config(folder)
    if config.model_type not in model_types:
        raise ConfigError(f"{folder}/config.json: model_type {config.model_type!r} is not Qwen3-VL")
    tied = untie(config)
    with torch.device("meta"):
        model = (cls or model_class())(config)
    model.entrain_tied_source = tied
    visual, lm = model.model.visual, model.model.language_model
    visual.rotary_pos_emb = type(visual.rotary_pos_emb)(visual.config)
    lm.rotary_emb = type(lm.rotary_emb)(config=lm.config)
    use_varlen_vision_attention(visual)
    lm.config._attn_implementation = PACKED_ATTENTION
    if stages is None:
        stages = [(c, 0, n) for c, n in layer_counts(model).items()]
    names = [n for c, a, b in stages for n, _ in build_stage(model, c, a, b).owned_parameters()]
    load_parameters(model, folder, names, strict=strict)
    return model


def _longest(bounds: torch.Tensor) -> int:
    """The longest span of cumulative ``bounds`` (host tensor)."""
    return int((bounds[1:] - bounds[:-1]).max()) if bounds.numel() > 1 else 0


def _as_parts(x) -> dict[str, torch.Tensor]:
    if isinstance(x, dict):
        return dict(x)
    return {HIDDEN: x}


class VisionStage(nn.Module):
    """Layers ``[first, end)`` of ``[patch_embed, blocks..., merger]`` of ``model.visual``; the DeepStack
    merger of a tapped block runs on the stage of the block.

    ``forward(parts, grid)``: ``parts["hidden"]`` is ``[N, 1536]`` patches (first stage) or ``[N, w]``
    patch states; returns ``hidden`` (patch states, or ``[M, H]`` merged image features after the
    merger) with every DeepStack part made so far."""

    def __init__(self, model: nn.Module, first: int, end: int):
        super().__init__()
        vis = model.model.visual
        self.vis = vis
        depth = len(vis.blocks)
        self.first, self.end = first, end
        self.block_ids = [i - 1 for i in range(max(first, 1), min(end, depth + 1))]
        self.has_patch_embed = first == 0
        self.has_merger = end == depth + 2
        self.taps = list(vis.deepstack_visual_indexes)
        self.takes_parts = True

    def parts_in(self) -> tuple[str, ...]:
        """``hidden`` and the DeepStack parts made by earlier stages (taps below block ``first - 1``)."""
        return (HIDDEN, *(deepstack_part(k) for k, b in enumerate(self.taps) if b + 1 < self.first))

    def parts_out(self) -> tuple[str, ...]:
        return (HIDDEN, *(deepstack_part(k) for k, b in enumerate(self.taps) if b + 1 < self.end))

    def owned_parameters(self) -> list[tuple[str, nn.Parameter]]:
        vis = self.vis
        mods: list[tuple[str, nn.Module]] = []
        if self.has_patch_embed:
            mods += [("patch_embed", vis.patch_embed), ("pos_embed", vis.pos_embed)]
        for i in self.block_ids:
            mods.append((f"blocks.{i}", vis.blocks[i]))
            if i in self.taps:
                k = self.taps.index(i)
                mods.append((f"deepstack_merger_list.{k}", vis.deepstack_merger_list[k]))
        if self.has_merger:
            mods.append(("merger", vis.merger))
        return [(f"{VISION_PREFIX}{n}.{pn}", p) for n, m in mods for pn, p in m.named_parameters()]

    def move_to(self, device: torch.device) -> None:
        for _, p in self.owned_parameters():
            p.data = p.data.to(device)
        self.vis.rotary_pos_emb.to(device)

    def _embed(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        from transformers.vision_utils import get_vision_interpolation_indices_and_weights

        vis = self.vis
        idx, weights = get_vision_interpolation_indices_and_weights(
            grid, num_grid_per_side=vis.num_grid_per_side, mode=vis.interpolation_mode,
            align_corners=vis.interpolation_align_corners, spatial_merge_size=vis.config.spatial_merge_size,
        )  # fmt: skip
        x = vis.patch_embed(x)
        pos = (vis.pos_embed(idx.to(x.device)) * weights.to(x.device, x.dtype)[:, :, None]).sum(1)
        return x + pos.to(x.dtype)

    def forward(self, parts, grid: torch.Tensor) -> dict[str, torch.Tensor]:
        from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids

        out = _as_parts(parts)
        vis = self.vis
        grid = grid[:, :3]
        x = out[HIDDEN]
        if self.has_patch_embed:
            x = self._embed(x, grid.to(x.device))
        if self.block_ids:
            cu = get_vision_cu_seqlens(grid.cpu())
            pos = get_vision_position_ids(grid.to(x.device), vis.spatial_merge_size)
            emb = vis.rotary_pos_emb(x, pos)
            for i in self.block_ids:
                x = vis.blocks[i](x, cu_seqlens=cu, max_seqlen=_longest(cu), position_embeddings=emb)
                if i in self.taps:
                    k = self.taps.index(i)
                    out[deepstack_part(k)] = vis.deepstack_merger_list[k](x)
        if self.has_merger:
            x = vis.merger(x)
        out[HIDDEN] = x
        return out


class _LanguageModelView(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.model.language_model
        self.lm_head = model.lm_head


class TextStage(LLMStage):
    """Layers ``[first, end)`` of ``[embed_tokens, layers..., norm, lm_head, loss]``; decoder layer
    ``k < taps`` adds part ``deepstack_k`` to its output at ``batch.image_positions``.

    ``forward(parts, batch)``: ``parts["hidden"]`` is the ``[M, H]`` image features (first stage; None
    or ``[0, H]`` for text only) or ``[1, T, H]``; returns ``hidden`` (``[1, T, H]``, ``[n, V]`` logits,
    or the scalar loss) with the DeepStack parts later stages still add."""

    def __init__(self, model: nn.Module, first: int, end: int):
        super().__init__(SimpleNamespace(llm=_LanguageModelView(model)), first, end)
        self.taps = len(model.model.visual.deepstack_visual_indexes)
        self.takes_parts = True

    def parts_in(self) -> tuple[str, ...]:
        return (HIDDEN, *(deepstack_part(k) for k in range(self.taps) if k + 1 >= self.first))

    def parts_out(self) -> tuple[str, ...]:
        return (HIDDEN, *(deepstack_part(k) for k in range(self.taps) if k + 1 >= self.end))

    def owned_parameters(self) -> list[tuple[str, nn.Parameter]]:
        renamed = []
        for name, p in super().owned_parameters():
            rest = name[len("llm.") :]
            renamed.append((LLM_PREFIX + rest[len("model.") :] if rest.startswith("model.") else rest, p))
        return renamed

    def forward(self, parts, batch) -> dict[str, torch.Tensor]:
        out = _as_parts(parts)
        inner = self.llm.model
        x = out.pop(HIDDEN, None)
        if self.has_embed:
            h = inner.embed_tokens(batch.input_ids.unsqueeze(0))
            if batch.image_positions.numel():
                h = h.index_put(
                    (torch.zeros_like(batch.image_positions), batch.image_positions), x.to(h.dtype)
                )
            x = h
        if self.layer_ids:
            pos = batch.position_ids.unsqueeze(-2)
            emb = inner.rotary_emb(x, pos)
            for i in self.layer_ids:
                x = self.decoder_layer(i, x, pos, emb, batch, out)
                feature = out.pop(deepstack_part(i), None)
                if feature is not None and batch.image_positions.numel():
                    x = _add_at(x, batch.image_positions, feature)
        if self.has_norm:
            x = inner.norm(x)
        if self.has_lm_head:
            x = self.llm.lm_head(x[0, batch.label_positions])
        if self.has_loss:
            return self.loss(x, batch, out)
        for name in self.parts_out()[1:]:  # a text-only microbatch: no visual rows
            if name not in out:
                out[name] = x.new_zeros((0, x.shape[-1]))
        out[HIDDEN] = x
        return out

    def decoder_layer(self, i: int, x: torch.Tensor, pos, emb, batch, parts: dict) -> torch.Tensor:
        """Decoder layer ``i`` on ``x [1, T, H]`` (``parts``: the message's other parts, which a variant
        may read or add to)."""
        return self.llm.model.layers[i](
            x, position_ids=pos, position_embeddings=emb, entrain_seq_lens=batch.seq_lens
        )

    def loss(self, logits: torch.Tensor, batch, parts: dict) -> torch.Tensor:
        """``sum(token CE) * loss_scale`` of the ``[n, V]`` label logits."""
        import torch.nn.functional as F

        return F.cross_entropy(logits.float(), batch.targets, reduction="sum") * batch.loss_scale


def _add_at(x: torch.Tensor, positions: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
    """``x [1, T, H]`` with ``feature [M, H]`` added at ``positions [M]`` (a new tensor)."""
    rows = torch.zeros_like(positions)
    return x.index_put((rows, positions), x[0, positions] + feature.to(x.dtype))


def build_stage(model: nn.Module, component: str, first: int, end: int) -> nn.Module:
    n = layer_counts(model).get(component)
    if n is None:
        raise ConfigError(f"unknown component {component!r} (expected encoder or llm)")
    if not 0 <= first < end <= n:
        raise ConfigError(f"{component} stage layers [{first}, {end}) outside 0..{n}")
    return (VisionStage if component == "encoder" else TextStage)(model, first, end)


def set_trainable(model: nn.Module, *, encoder: bool = True, merger: bool = True, llm: bool = True) -> None:
    """``requires_grad`` per part (``--freeze``): the ViT body, its mergers (the DeepStack mergers are
    mergers too), the language model + lm_head."""
    mergers = (VISION_PREFIX + "merger.", VISION_PREFIX + "deepstack_merger_list.")
    for name, p in model.named_parameters():
        if name.startswith(VISION_PREFIX):
            p.requires_grad_(merger if name.startswith(mergers) else encoder)
        else:
            p.requires_grad_(llm)
