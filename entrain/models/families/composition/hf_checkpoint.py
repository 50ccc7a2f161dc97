"""Stock Hugging Face checkpoints: build on the meta device, read only the tensors a rank owns.

``build_stock_vlm`` constructs the vision tower (``Qwen2_5_VisionTransformerPretrainedModel`` or
Qwen2-VL's ``Qwen2VisionTransformerPretrainedModel``) and the causal LM (``AutoModelForCausalLM``
of the folder's ``config.json``: Llama, Qwen2, ...) on the meta device, so no rank ever allocates
the whole model. ``materialize`` then reads, from ``model.safetensors`` or the shards named by
``model.safetensors.index.json``, exactly the tensors of the parameters it is given (the rank's
stages) and places them on the CPU; everything else stays on the meta device.

Tensor names: a vision-only folder stores ``blocks.0...``; a whole Qwen2(.5)-VL checkpoint stores
``visual.blocks.0...`` (or ``model.visual...``). A tied LLM (no ``lm_head.weight``) gives its
lm_head a copy of ``model.embed_tokens.weight`` (embedding and lm_head may sit on different stages,
so they are trained untied).

Embedding rows added for new tokens (``vocab_size`` above the checkpoint's, e.g. the image tokens
added to a Llama tokenizer) are initialised to the mean of the checkpoint's rows, in the embedding
and in the lm_head alike: a new token starts as the average token, and the lm_head's logit for it
starts at the average logit (no random numbers, so every rank and every run agree).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

import torch
from torch import nn

from entrain.core.errors import ConfigError
from entrain.models.families.composition.spec import read_config, vision_config_of

__all__ = [
    "SafetensorsFolder",
    "build_stock_vision",
    "build_stock_llm",
    "materialize",
    "check_unexpected",
    "VISION_PREFIXES",
]

VISION_PREFIXES = ("", "visual.", "model.visual.")
INDEX_FILE = "model.safetensors.index.json"


class SafetensorsFolder:
    """Tensor name -> file of a checkpoint folder (single file or sharded); reads one tensor at a time."""

    def __init__(self, folder: str):
        self.folder = folder
        index = os.path.join(folder, INDEX_FILE)
        if os.path.exists(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
            except (OSError, KeyError, json.JSONDecodeError) as e:
                raise ConfigError(f"{index}: unreadable shard index ({e})") from None
            self.files = {k: os.path.join(folder, v) for k, v in weight_map.items()}
        else:
            singles = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
            if not singles:
                raise ConfigError(f"{folder}: no model.safetensors and no {INDEX_FILE}")
            from safetensors import safe_open

            from entrain.core.safetensors_header import safetensors_problem

            self.files = {}
            for name in singles:
                problem = safetensors_problem(os.path.join(folder, name))
                if problem is not None:
                    raise ConfigError(f"{os.path.join(folder, name)}: {problem}")
                with safe_open(os.path.join(folder, name), "pt") as f:
                    self.files.update({k: os.path.join(folder, name) for k in f.keys()})  # noqa: SIM118
        self.read_files: set[str] = set()
        """Files opened so far (tests check that a rank opens only its stages' shards)."""

    def __contains__(self, key: str) -> bool:
        return key in self.files

    def read(self, keys: Iterable[str]) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        by_file: dict[str, list[str]] = {}
        for k in keys:
            if k not in self.files:
                raise ConfigError(f"{self.folder}: the checkpoint has no tensor {k!r}")
            by_file.setdefault(self.files[k], []).append(k)
        out = {}
        for path, names in by_file.items():
            self.read_files.add(path)
            try:
                with safe_open(path, "pt") as f:
                    out.update({k: f.get_tensor(k) for k in names})
            except OSError as e:
                raise ConfigError(f"{path}: cannot read ({e})") from None
        return out


def _on_meta(build):
    with torch.device("meta"):
        module = build()
    return module


def build_stock_vision(folder: str, blocks: tuple[int, tuple[int, ...]] | None = None) -> nn.Module:
    """The vision tower of ``folder`` on the meta device (its rotary table on the CPU). ``blocks``:
    ``(depth, fullatt_block_indexes)`` replacing the checkpoint's (the profiler's one block per kind)."""
    cfg = read_config(folder)
    vision, family = vision_config_of(cfg, os.path.join(folder, "config.json"))
    if blocks is not None:
        vision = {**vision, "depth": blocks[0]}
        if family == "qwen2_5_vl":
            vision["fullatt_block_indexes"] = list(blocks[1])
    if family == "qwen2_vl":
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig as Config
        from transformers.models.qwen2_vl.modeling_qwen2_vl import (
            Qwen2VisionTransformerPretrainedModel as Model,
        )
    else:
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig as Config
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
            Qwen2_5_VisionTransformerPretrainedModel as Model,
        )
    hf = Config(**{k: v for k, v in vision.items() if k not in ("model_type", "architectures")})
    module = _on_meta(lambda: Model(hf))
    module.rotary_pos_emb = type(module.rotary_pos_emb)(hf)
    module.entrain_family = family
    return module


def build_stock_llm(
    folder: str, attn_implementation: str, vocab_size: int | None = None, num_layers: int | None = None
) -> nn.Module:
    """The causal LM of ``folder`` on the meta device (rotary table on the CPU), with ``vocab_size``
    embedding rows and ``num_layers`` decoder layers (default: the checkpoint's) and an untied lm_head."""
    from transformers import AutoConfig, AutoModelForCausalLM

    read_config(folder)  # a clear error for a missing or malformed config.json
    try:
        hf = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{folder}/config.json: transformers cannot read it ({e})") from None
    if vocab_size is not None:
        hf.vocab_size = vocab_size
    if num_layers is not None:
        hf.num_hidden_layers = num_layers
        if getattr(hf, "layer_types", None) is not None:
            hf.layer_types = hf.layer_types[:num_layers]
    hf.tie_word_embeddings = False
    hf._attn_implementation = attn_implementation
    try:
        module = _on_meta(lambda: AutoModelForCausalLM.from_config(hf))
    except ValueError as e:
        raise ConfigError(f"{folder}: not a causal LM transformers can build ({e})") from None
    inner = module.model
    if not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        raise ConfigError(
            f"{folder}: {type(module).__name__} does not have Llama's layer structure "
            "(model.embed_tokens, model.layers, model.norm, lm_head)"
        )
    inner.rotary_emb = type(inner.rotary_emb)(config=hf)
    return module


def _vision_prefix(reader: SafetensorsFolder, probe: str) -> str:
    for prefix in VISION_PREFIXES:
        if prefix + probe in reader:
            return prefix
    raise ConfigError(
        f"{reader.folder}: no vision tower tensors (looked for {probe!r} under {VISION_PREFIXES})"
    )


def materialize(
    model: nn.Module,
    names: Iterable[str],
    *,
    vision_dir: str | None,
    llm_dir: str | None,
    strict: bool = False,
) -> dict[str, list[str]]:
    """Replace the meta parameters ``names`` (``vision.*`` / ``llm.*`` names of
    ``entrain.models.families.composition.model.VLM``) by the stock folders' tensors, as float32 CPU parameters (keeping
    ``requires_grad``). Returns the files read per folder. ``strict``: ``model`` is the folders' whole
    config.json, so a tensor of the vision tower or the LLM it has no parameter for is refused
    (``check_unexpected``)."""
    if strict:
        _check_whole(model, vision_dir, llm_dir)
    groups: dict[str, list[tuple[str, str]]] = {"vision": [], "llm": []}
    for name in names:
        part, rest = name.split(".", 1)
        groups[part].append((rest, name))
    read: dict[str, list[str]] = {}
    if groups["vision"]:
        reader = SafetensorsFolder(vision_dir)
        prefix = _vision_prefix(reader, groups["vision"][0][0])
        tensors = reader.read(prefix + n for n, _ in groups["vision"])
        for n, full in groups["vision"]:
            assign_tensor(model, full, tensors[prefix + n], f"{vision_dir}: {prefix + n}")
        read[vision_dir] = sorted(reader.read_files)
    if groups["llm"]:
        reader = SafetensorsFolder(llm_dir)
        keys = {n: ("model.embed_tokens.weight" if n == "lm_head.weight" and n not in reader else n)
                for n, _ in groups["llm"]}  # fmt: skip
        tensors = reader.read(set(keys.values()))
        for n, full in groups["llm"]:
            t = tensors[keys[n]]
            rows = model.get_parameter(full).shape[0]
            if n in ("model.embed_tokens.weight", "lm_head.weight") and t.shape[0] < rows:
                mean = t.float().mean(0, keepdim=True).to(t.dtype)
                t = torch.cat([t, mean.expand(rows - t.shape[0], -1)])
            assign_tensor(model, full, t, f"{llm_dir}: {keys[n]}")
        read[llm_dir] = sorted(reader.read_files)
    return read


def _check_whole(model: nn.Module, vision_dir: str, llm_dir: str) -> None:
    """Every tensor of the vision tower (under its prefix) and of the LLM folder has a parameter."""
    vision = [n for n, _ in model.vision.named_parameters()]
    reader = SafetensorsFolder(vision_dir)
    prefix = _vision_prefix(reader, vision[0])
    check_unexpected(reader, [prefix + n for n in vision], (prefix,))
    reader = SafetensorsFolder(llm_dir)
    llm = [n for n, _ in model.llm.named_parameters()]
    check_unexpected(reader, [*llm, *(["model.embed_tokens.weight"] if "lm_head.weight" in llm else [])])


def check_unexpected(
    reader: SafetensorsFolder, used: Iterable[str], prefixes: tuple[str, ...] = ("",)
) -> None:
    """ConfigError naming the folder and a few of its tensors (those under ``prefixes``) that the model
    built from its config.json has no parameter for: weights of layers the config does not have would
    otherwise be left out silently and a truncated model trained."""
    used = set(used)
    extra = sorted(k for k in reader.files if k.startswith(prefixes) and k not in used)
    if extra:
        raise ConfigError(
            f"{reader.folder}: {len(extra)} tensor(s) that its config.json has no parameter for (e.g. "
            f"{', '.join(extra[:3])}): the config and the weights disagree (fewer layers in the config?)"
        )


def assign_tensor(model: nn.Module, name: str, t: torch.Tensor, where: str) -> None:
    path, _, leaf = name.rpartition(".")
    owner = model.get_submodule(path)
    old = getattr(owner, leaf)
    if tuple(t.shape) != tuple(old.shape):
        raise ConfigError(f"{where}: shape {tuple(t.shape)} but the config.json implies {tuple(old.shape)}")
    setattr(owner, leaf, nn.Parameter(t.to(torch.float32), requires_grad=old.requires_grad))
