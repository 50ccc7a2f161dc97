"""A Qwen2.5-Omni thinker checkpoint as Entrain pipeline stages.

The model is transformers' own ``Qwen2_5OmniThinkerForConditionalGeneration`` (audio tower, vision
tower, Qwen2.5 language model) built on the meta device; only the parameters of a rank's stages are
read from the folder's safetensors (float32, CPU), so parameter names are transformers'
(``model.audio_tower.*``, ``model.visual.*``, ``model.language_model.*``, ``lm_head.weight``);
checkpoints with the older names (``audio_tower.*``, ``visual.*``, ``model.layers.*``) or a whole
Qwen2.5-Omni folder's ``thinker.*`` names load too. A tied checkpoint's lm_head gets a copy of the
embedding (they may sit on different stages, so they train untied).

Stage layout. The encoder list is the vision tower's ``[patch_embed, blocks..., merger]``; the audio
tower runs whole on the stage holding ``patch_embed`` (the first encoder stage), beside the vision
tower: one encoder pipeline feeds the LLM. The LLM list is ``[embed_tokens, layers..., norm,
lm_head, loss]``. A plan with an encoder pipeline per tower (``StageSpec.encoder``) builds
``vision`` stages (the vision tower's layers, no audio tower) and ``audio`` stages
(``OmniAudioStage``, its layers ``[first, end)`` of ``[conv, layers..., proj]``
as ``planning.encoders.audio_tower_specs`` orders them; run whole they compute what transformers'
``Qwen2_5OmniAudioEncoder.forward`` does); the runtime hands the audio pipeline's output to the first LLM stage
as its ``audio`` part (``spec.ENCODER_PARTS``).

Messages are named parts (``dict[str, Tensor]``):

* first encoder stage input: ``hidden`` = ``[N, 1176]`` patches of the microbatch's images and videos
  (visual items in the order their tokens appear), and, with audio, ``audio_mel`` = ``[F, mel]`` mel
  frames of its audio clips concatenated in order with ``audio_lengths`` = ``[A]`` int64 frames per
  clip (a plain tensor input means patches only);
* ``audio`` = ``[audio tokens, H]``: the audio tower's output, made by the first encoder stage,
  forwarded by every later encoder stage and added into the sequence by the first LLM stage at the
  audio placeholder tokens (``audio_token_id``), as transformers' ``masked_scatter`` does;
* ``hidden``: the vision tower's states, then ``[M, H]`` visual features (scattered at
  ``batch.image_positions``: every image and video placeholder, in order), then LLM hidden states.

Every encoder stage's message carries the ``audio`` part (``spec.AUDIO_PART``, declared on every encoder
layer; ``[0, H]`` when no clip is in the microbatch); the runtime cuts it per sample by its audio
tokens at the encoder -> LLM boundary.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import SimpleNamespace

import torch
from torch import nn

from entrain.core.errors import ConfigError
from entrain.models.families.composition.hf_checkpoint import (
    SafetensorsFolder,
    assign_tensor,
    check_unexpected,
)
from entrain.models.families.composition.model import EncoderStage, LLMStage
from entrain.models.families.packed_attention import PACKED_ATTENTION, use_varlen_vision_attention
from entrain.models.families.qwen2_vl.model import untie

__all__ = ["read_hf_config", "model_class", "build_model", "build_stage", "layer_counts", "load_parameters",
           "set_trainable", "untie", "HIDDEN", "AUDIO", "AUDIO_MEL", "AUDIO_LENGTHS", "OmniEncoderStage",
           "OmniLLMStage", "OmniAudioStage", "AUDIO_PREFIX", "audio_layer_count"]  # fmt: skip

VISION_PREFIX = "model.visual."
LLM_PREFIX = "model.language_model."
HIDDEN = "hidden"
AUDIO = "audio"  # spec.AUDIO_PART; also the audio encoder's pipeline name (spec.ENCODER_PARTS)
VISION = "vision"
AUDIO_LENGTHS = "audio_lengths"
THINKER = "qwen2_5_omni_thinker"

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


WHOLE = "qwen2_5_omni"


def read_hf_config(folder: str):
    """Transformers' thinker config of the checkpoint in ``folder`` (a thinker folder, or a whole
    Qwen2.5-Omni folder's ``thinker_config``); ConfigError otherwise."""
    from transformers import AutoConfig

    from entrain.models.families.qwen2_5_omni.spec import check_supported
    from entrain.models.families.registry import read_config

    where = f"{folder}/config.json"
    check_supported(read_config(folder), where)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{where}: transformers cannot read it ({e})") from None
    return config.thinker_config if config.model_type == WHOLE else config


def model_class() -> type:
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    return Qwen2_5OmniThinkerForConditionalGeneration


def layer_counts(model: nn.Module) -> dict[str, int]:
    """``encoder`` = patch_embed (with the audio tower) + blocks + merger, ``llm`` = embed + layers +
    norm + lm_head + loss."""
    return {"encoder": len(model.model.visual.blocks) + 2, "llm": len(model.model.language_model.layers) + 4}


def build_model(folder: str, *, stages: Sequence[tuple[str, int, int]] | None = None, hf_config=None,
                strict: bool = True) -> nn.Module:  # fmt: skip
    """The thinker of checkpoint ``folder`` on the meta device with the parameters of ``stages``
    (``(component, first, end)``; None: all) loaded as float32 CPU tensors."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import SinusoidsPositionEmbedding

    config = hf_config if hf_config is not None else read_hf_config(folder)
    tied = untie(config)
    with torch.device("meta"):
        model = model_class()(config)
    model.entrain_tied_source = tied
    inner = model.model
    visual, lm, audio = inner.visual, inner.language_model, inner.audio_tower
    visual.rotary_pos_emb = type(visual.rotary_pos_emb)(visual.config)
    lm.rotary_emb = type(lm.rotary_emb)(config=lm.config)
    audio.positional_embedding = SinusoidsPositionEmbedding(audio.max_source_positions, audio.config.d_model)
    use_varlen_vision_attention(visual)
    lm.config._attn_implementation = PACKED_ATTENTION
    audio.config._attn_implementation = "sdpa"  # per audio chunk (transformers' non-flash path)
    if stages is None:
        stages = [(c, 0, n) for c, n in layer_counts(model).items()]
    names = [n for c, a, b in stages for n, _ in build_stage(model, c, a, b).owned_parameters()]
    load_parameters(model, folder, names, strict=strict)
    return model


def _candidates(name: str) -> list[str]:
    """Where a thinker folder (transformers 5's names or the older ones) or a whole Qwen2.5-Omni
    folder (``thinker.`` + the older names) keeps parameter ``name``."""
    if name.startswith(LLM_PREFIX):
        old = "model." + name[len(LLM_PREFIX) :]
    elif name.startswith("model."):
        old = name[len("model.") :]
    else:
        old = name
    out = [name, old, "thinker." + old]
    if name == "lm_head.weight":  # tied
        out += [
            LLM_PREFIX + "embed_tokens.weight",
            "model.embed_tokens.weight",
            "thinker.model.embed_tokens.weight",
        ]
    return out


def _key(name: str, reader: SafetensorsFolder) -> str:
    for key in _candidates(name):
        if key in reader:
            return key
    raise ConfigError(
        f"{reader.folder}: the checkpoint has no tensor for {name!r} (looked for {_candidates(name)[:3]})"
    )


def load_parameters(model: nn.Module, folder: str, names: Iterable[str], *, strict: bool = True) -> list[str]:
    """Replace the meta parameters ``names`` by the folder's tensors; returns the files read.
    ``strict``: every parameter of the thinker has a tensor, and every tensor of a thinker folder
    (of a whole folder: under ``thinker.``) a parameter (ConfigError naming a few)."""
    reader = SafetensorsFolder(folder)
    names = list(names)
    if strict and names:
        every = {n: _key(n, reader) for n, _ in model.named_parameters()}
        whole = any(k.startswith("thinker.") for k in every.values())
        check_unexpected(reader, every.values(), ("thinker.",) if whole else ("",))
    keys = {n: _key(n, reader) for n in names}
    tensors = reader.read(set(keys.values()))
    used: set[str] = set()
    for n, key in keys.items():
        t = tensors[key].clone() if key in used else tensors[key]
        used.add(key)
        assign_tensor(model, n, t, f"{folder}: {key}")
    return sorted(reader.read_files)


def _as_parts(x) -> dict:
    if isinstance(x, dict):
        return dict(x)
    return {HIDDEN: x}


def _out(parts: dict) -> torch.Tensor | dict:
    """A plain tensor when only ``hidden`` is left (an image-only run's messages)."""
    return parts[HIDDEN] if set(parts) == {HIDDEN} else parts


class OmniEncoderStage(EncoderStage):
    """Layers ``[first, end)`` of ``[patch_embed, blocks..., merger]`` of ``model.visual``; the stage
    holding ``patch_embed`` runs the audio tower too (module docstring)."""

    def __init__(self, model: nn.Module, first: int, end: int, *, with_audio: bool = True):
        super().__init__(SimpleNamespace(vision=model.model.visual), first, end)
        self.prefix = VISION_PREFIX
        self.audio_tower = model.model.audio_tower if first == 0 and with_audio else None
        self.takes_parts = True

    def owned_parameters(self) -> list[tuple[str, nn.Parameter]]:
        own = super().owned_parameters()
        if self.audio_tower is not None:
            own = [(AUDIO_PREFIX + n, p) for n, p in self.audio_tower.named_parameters()] + own
        return own

    def move_to(self, device: torch.device) -> None:
        super().move_to(device)
        if self.audio_tower is not None:
            self.audio_tower.positional_embedding.to(device)

    def _audio(self, mel: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The audio tower on ``[F, mel]`` frames of clips of ``lengths`` frames: ``[tokens, H]``."""
        lengths = lengths.to(torch.int64).cpu()
        feats = mel.t().to(self.audio_tower.conv1.weight.dtype)
        return self.audio_tower(feats, feature_lens=lengths).last_hidden_state

    def forward(self, x, grid_thw: torch.Tensor):
        parts = _as_parts(x)
        mel, lengths = parts.pop(AUDIO_MEL, None), parts.pop(AUDIO_LENGTHS, None)
        h = parts[HIDDEN]
        if mel is not None and lengths is not None and lengths.numel():
            if self.audio_tower is None:
                raise ValueError("audio inputs reach an encoder stage without the audio tower")
            parts[AUDIO] = self._audio(mel, lengths)
        elif self.audio_tower is not None:  # the declared part, empty: no clip in the microbatch
            parts[AUDIO] = h.new_zeros((0, self.audio_tower.proj.out_features))
        if grid_thw.shape[0]:
            parts[HIDDEN] = super().forward(h, grid_thw[:, :3])
        else:  # no image or video: an empty visual message of the stage's output width
            vis = self.vis
            width = vis.merger.mlp[-1].out_features if self.has_merger else vis.config.hidden_size
            parts[HIDDEN] = h.new_zeros((0, width))
        return _out(parts)


class _LanguageModelView(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.model.language_model
        self.lm_head = model.lm_head


class OmniLLMStage(LLMStage):
    """Layers ``[first, end)`` of ``[embed_tokens, layers..., norm, lm_head, loss]``; the first one puts
    the visual features at ``batch.image_positions`` and the ``audio`` part at the audio placeholders."""

    def __init__(self, model: nn.Module, first: int, end: int):
        super().__init__(SimpleNamespace(llm=_LanguageModelView(model)), first, end)
        self.audio_token_id = int(model.config.audio_token_id)
        self.takes_parts = True

    def owned_parameters(self) -> list[tuple[str, nn.Parameter]]:
        renamed = []
        for name, p in super().owned_parameters():
            rest = name[len("llm.") :]
            renamed.append((LLM_PREFIX + rest[len("model.") :] if rest.startswith("model.") else rest, p))
        return renamed

    def forward(self, x, batch):
        from dataclasses import replace

        parts = _as_parts(x)
        audio, x = parts.pop(AUDIO, None), parts.pop(HIDDEN, None)
        if self.has_embed:  # the audio rows join the visual ones: one scatter into the embeddings
            where = (batch.input_ids == self.audio_token_id).nonzero()[:, 0]
            got = 0 if audio is None else audio.shape[0]
            if got != where.numel():
                raise ValueError(f"{where.numel()} audio tokens but {got} audio feature rows")
            if got:
                x = (
                    audio
                    if x is None or not batch.image_positions.numel()
                    else torch.cat([x, audio.to(x.dtype)])
                )
                batch = replace(batch, image_positions=torch.cat([batch.image_positions, where]))
        return super().forward(x, batch)


def build_stage(model: nn.Module, component: str, first: int, end: int) -> nn.Module:
    """A stage of ``component``: ``encoder`` (the vision tower with the audio tower on its first stage)
    or ``llm``; in a plan with several encoders an encoder stage's pipeline, ``vision`` (the vision
    tower alone, the encoder's layers) or ``audio`` (``OmniAudioStage``)."""
    counts = {**layer_counts(model), VISION: layer_counts(model)["encoder"],
              AUDIO: audio_layer_count(model.model.audio_tower)}  # fmt: skip
    n = counts.get(component)
    if n is None:
        raise ConfigError(f"unknown component {component!r} (expected one of {', '.join(counts)})")
    if not 0 <= first < end <= n:
        raise ConfigError(f"{component} stage layers [{first}, {end}) outside 0..{n}")
    if component == AUDIO:
        return OmniAudioStage(model, first, end)
    if component == VISION:
        return OmniEncoderStage(model, first, end, with_audio=False)
    return (OmniEncoderStage if component == "encoder" else OmniLLMStage)(model, first, end)


def set_trainable(model: nn.Module, *, encoder: bool = True, merger: bool = True, llm: bool = True) -> None:
    """``requires_grad`` per part (``--freeze``): the encoders' bodies (vision blocks and the audio
    tower), the vision merger, the language model + lm_head."""
    for name, p in model.named_parameters():
        if name.startswith(VISION_PREFIX):
            p.requires_grad_(merger if name.startswith(VISION_PREFIX + "merger.") else encoder)
        elif name.startswith(AUDIO_PREFIX):
            p.requires_grad_(encoder)
        else:
            p.requires_grad_(llm)
