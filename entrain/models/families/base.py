"""The seam every model family implements: ``ModelFamily``.

A *family* is one folder ``entrain/models/families/<name>/`` plus one ``register_family`` call
(``entrain.models.families.registry``). It owns everything that depends on the model's architecture;
the rest of Entrain (``core``, ``sim``, ``runtime``, ``cli``) asks the family and never names one.

Two halves, so the planner stays torch-free:

* **Plain numbers** (no torch import, at module level or inside): reading ``config.json`` into the
  family's own *shape* object (``ModelShape``: a name, the per-layer cost specs
  ``entrain.core.model.layer_specs.LayerSpec`` the cost model prices, the parameter count), the image token rule
  the sample metadata uses (``entrain.core.workload.samples.ImageTokenRule``), and the TP check. ``plan`` and
  ``simulate`` use only these.
* **Runtime** (torch; import it inside the methods, lazily): the run's model config, the model built on
  the meta device (or from a seed) with only a rank's tensors loaded, its pipeline stage modules, the
  TP plan, FSDP units, recompute blocks, how a sample's tokens/pixels are laid out, the LLM position
  ids of a packed batch, checkpoint names and export.

Vocabulary used in the docstrings. Components are ``"encoder"`` and ``"llm"``; each has an ordered
layer list (``layer_names``) and a stage owns a half-open range ``[first, end)`` of one list
(``entrain.core.ir.plan.StageSpec``). Shapes: ``N`` encoder input rows of a packed set of images
(patches, or tiles x patches), ``M`` image feature rows the LLM receives (merged tokens), ``T`` packed
LLM tokens, ``H`` LLM hidden size, ``V`` vocabulary. Units: tokens, pixels, bytes, milliseconds.

Stage module contract (what ``build_stage`` returns; the runtime's executor, trainer, checkpoint and
parallelize code relies on exactly this):

* ``entrain_family``: the family's name (attribute; ``registry.build_stage`` sets it when missing; the
  whole model carries it too, so ``registry.family_of(module)`` finds the family).
* ``owned_parameters() -> list[(full_name, nn.Parameter)]``: the parameters this stage trains, keyed by
  the whole model's ``named_parameters`` names (checkpoints and gradient comparisons use them).
* ``move_to(device)``: move the owned parameters (and any buffers the forward needs) to ``device``.
* encoder stage ``forward(x, grid) -> Tensor``: ``x`` is ``[N, encoder_input_width]`` on the first
  stage, else the previous stage's output; ``grid`` is the ``[images, 3 + k]`` int64 host tensor of
  ``image_grids`` (columns 0..2) followed by the family's ``image_extras`` (k columns, e.g. the
  original image size; k = 0 by default). Returns ``[M, H]`` image features in image order on the last stage (rows per
  image: ``image_feature_rows``), an intermediate tensor otherwise.
* LLM stage ``forward(x, batch) -> Tensor``: ``batch`` is an ``LLMBatch`` (``entrain.models.batch``);
  ``x`` is the ``[M, H]`` image features on the first stage (None for a text-only batch), else the
  previous stage's output. Returns ``[1, T, H]`` hidden states, ``[n, V]`` logits at the label
  positions, or the scalar loss ``sum(token CE) * batch.loss_scale`` on the stage holding ``loss``.

Message parts (several tensors between stages, e.g. DeepStack features a vision tower hands to the
first LLM layers). A message between stages is a set of named tensors: ``"hidden"`` (what the contract
above calls the output) and the parts a family declares, plain numbers, on its ``LayerSpec``s
(``entrain.core.model.layer_specs``): ``LayerSpec.message_parts`` = the ``MessagePart``s (name, width, dtype
size, rows) a stage boundary right after that layer carries besides ``"hidden"`` (every part a later
stage needs, on each boundary it crosses); ``LayerSpec.no_cut_after`` = no stage may end after that
layer (the planner's partition honours it). The cost model prices each part, the Plan's stages carry
them (``StageSpec.parts``). At run time a stage module that sets ``takes_parts = True`` receives
``x`` as a ``dict[str, Tensor]`` of every part (first LLM stage: each part's rows of the batch's
samples, concatenated; every part at the encoder -> LLM boundary has one row per image feature row;
``{}`` for a text-only batch), and any stage may return a ``dict[str, Tensor]`` (a tensor is the
``"hidden"`` part). A declared part the module does not return but received rides along: the runtime
sends it on, and its gradient back. Without ``takes_parts`` nothing changes: ``x`` is ``"hidden"``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from entrain.core.errors import ConfigError
from entrain.core.model.shape import ModelShape

if TYPE_CHECKING:  # annotations only: this module never imports torch
    import torch
    from torch import nn

    from entrain.core.workload.samples import ImageTokenRule, SampleMeta

__all__ = [
    "ModelSource",
    "ModelShape",
    "ModelFamily",
    "FamilyBase",
    "FolderConfig",
    "PackedSample",
    "COMPONENTS",
]

COMPONENTS = ("encoder", "llm")


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where a run's model comes from, as the user gave it (exactly one kind is set):

    * ``preset``: a ``--model`` preset name (a family lists its presets in ``preset_names``);
    * ``vision_model`` + ``llm_model``: two stock folders of a composition (``--vision-model`` /
      ``--llm-model``);
    * ``model_path``: one whole Hugging Face checkpoint folder (``--model-path``); the registry picks
      the family from its ``config.json`` (``family_of_folder``).

    ``tokenizer``: a tokenizer folder overriding the checkpoint's own (``--tokenizer``)."""

    preset: str = "tiny"
    vision_model: str | None = None
    llm_model: str | None = None
    model_path: str | None = None
    tokenizer: str | None = None

    @property
    def is_stock(self) -> bool:
        """True when the model comes from checkpoint folders rather than a preset."""
        return self.vision_model is not None or self.llm_model is not None or self.model_path is not None


@dataclass(frozen=True)
class FolderConfig:
    """A run's model read from a checkpoint: the ``folder`` and its ``shape`` (a ``ModelShape``: name,
    vision and LLM architectures). A family's subclass adds its ``family`` field, ``layer_names`` and
    ``hf`` (transformers' config of the folder)."""

    folder: str
    shape: Any

    @property
    def name(self) -> str:
        return self.shape.name

    @property
    def vision(self):
        return self.shape.vision

    @property
    def llm(self):
        return self.shape.llm


@dataclass(frozen=True, slots=True)
class PackedSample:
    """What ``position_ids`` sees of one sample of a packed LLM batch (a view of the renderer's
    ``RenderedSample``): ``input_ids [L]`` int64 in the model's vocabulary, ``image_positions [m]``
    (positions of its image placeholder tokens, images in order) and ``grids`` (its images' ``(t, h,
    w)`` encoder grids, as ``image_grids`` gave them) and ``audio_lengths`` (mel frames per audio clip);
    with videos (a family that ``accepts_video``), ``video_grids`` (each video's grid, in order) and
    ``second_per_grids`` (each video's seconds per temporal patch)."""

    input_ids: Any
    image_positions: Any
    grids: tuple[tuple[int, int, int], ...]
    audio_lengths: tuple[int, ...] = ()
    video_grids: tuple[tuple[int, int, int], ...] = ()
    second_per_grids: tuple[float, ...] = ()


@runtime_checkable
class ModelFamily(Protocol):
    """One model family. Implementations subclass ``FamilyBase`` (below: the defaults of the optional
    methods) and register an instance with ``entrain.models.families.registry.register_family``."""

    name: str
    """Registry key, e.g. ``"composition"``; also stored in plans and run manifests."""
    description: str
    """One line for ``entrain data families`` and error messages."""

    # ---------------------------------------------------------------------------------------------
    # Plain numbers (torch-free)
    # ---------------------------------------------------------------------------------------------
    def preset_names(self) -> tuple[str, ...]:
        """The ``--model`` presets this family serves (may be empty)."""
        ...

    def code_names(self) -> tuple[str, ...]:
        """Case-sensitive strings that name this family in code: its registry name, the ``model_type``
        values and transformers class-name stems it builds on (e.g. ``"qwen2_5_vl"``, ``"Qwen2_5"``).
        Outside the family's folder no code may contain one (``tests/models/test_family_seam.py``)."""
        ...

    def claims_config(self, config: dict) -> bool:
        """True when a ``config.json`` dict (its ``model_type`` / ``architectures``) is a whole
        checkpoint of this family (what ``--model-path`` takes)."""
        ...

    def shape(self, source: ModelSource) -> ModelShape:
        """The model's ``ModelShape`` read from ``source`` (a preset, or ``config.json`` files only;
        never tensors); ConfigError naming the file and field for a bad config."""
        ...

    def layer_names(self, shape: ModelShape, component: str) -> list[str]:
        """The ordered layer names of ``component`` (``"encoder"`` / ``"llm"``); same length and order
        as ``shape.layer_specs()[component]``. The last LLM layer is ``"loss"``."""
        ...

    def image_rule(self, shape: ModelShape, min_pixels: int | None, max_pixels: int | None) -> ImageTokenRule:
        """How an image of ``(H, W)`` pixels becomes encoder units (patches per attention unit: per
        image, or per tile) and LLM tokens, within the ``--min-pixels`` / ``--max-pixels`` limits
        (None: the family's defaults). Plain numbers: the data and cost layers call it."""
        ...

    def check_tp(self, shape: ModelShape, tp: int) -> None:
        """ConfigError unless ``tp`` divides every dimension the family's TP plan shards."""
        ...

    # ---------------------------------------------------------------------------------------------
    # Runtime (torch, imported lazily inside the implementations)
    # ---------------------------------------------------------------------------------------------
    def runtime_config(self, source: ModelSource, shape: ModelShape | None = None) -> tuple[Any, Any]:
        """``(cfg, tokenizer)``: the family's runtime model config for ``source`` (what every other
        runtime method takes as ``cfg``; it has ``.family`` = this family's name, ``.name`` and
        ``.shape``) and the text tokenizer (None: Entrain's built-in Qwen2 tokenizer). ``shape``:
        build from this shape instead (e.g. the profiler's reduced model)."""
        ...

    def build_model(
        self,
        cfg: Any,
        *,
        seed: int = 0,
        weights_dir: str | None = None,
        dtype: torch.dtype | None = None,
        stages: Sequence[tuple[str, int, int]] | None = None,
    ) -> nn.Module:
        """The whole model of ``cfg``: random init from ``seed`` (a preset), the weights in
        ``weights_dir``, or a checkpoint's tensors. A checkpoint is built on the meta device and only
        the parameters of ``stages`` (``(component, first, end)``; None: all) are read, as float32 CPU
        parameters; the rest stay on meta. The same seed gives the same weights on every rank."""
        ...

    def empty_model(self, cfg: Any) -> nn.Module:
        """The whole model of ``cfg`` without reading any checkpoint (parameters may stay on the meta
        device): what ``entrain profile`` fills with cheap random values to time layers."""
        ...

    def build_stage(self, model: nn.Module, component: str, first: int, end: int) -> nn.Module:
        """The stage module of layers ``[first, end)`` of ``component`` (contract in the module
        docstring); it references ``model``'s submodules, so parameter names stay the model's."""
        ...

    def set_trainable(
        self, model: nn.Module, *, encoder: bool = True, merger: bool = True, llm: bool = True
    ) -> None:
        """``requires_grad`` per part (``--freeze``): the encoder body, its projector/merger, the LLM."""
        ...

    def encoder_output_width(self, stage: nn.Module) -> int:
        """Columns of ``stage``'s output (encoder stage): ``H`` after the projector, the encoder width
        before it. The runtime builds a ``[0, width]`` output for a text-only microbatch."""
        ...

    def recompute_modules(self, stage: nn.Module, mode: str) -> list[nn.Module]:
        """The modules whose forward ``mode`` (``none`` / ``selective`` / ``full``) wraps in
        ``torch.utils.checkpoint`` on ``stage``: ``full``: every layer but a component's first;
        ``selective``: each transformer layer's attention sub-block (as the cost model prices them)."""
        ...

    def prepare_for_sharding(self, stage: nn.Module) -> None:
        """Rewrite modules of ``stage`` before TP/FSDP turn parameters into DTensors (e.g. split a fused
        qkv); checkpoint names must not change (``checkpoint_parts``). Default: nothing."""
        ...

    def apply_tp(self, stage: nn.Module, mesh: Any) -> None:
        """Tensor-parallelise the layers ``stage`` owns over ``mesh`` (its TP group's 1-D DeviceMesh),
        with ``torch.distributed.tensor.parallel``. Outputs of a stage stay replicated over the group."""
        ...

    def fsdp_units(self, stage: nn.Module) -> list[nn.Module]:
        """The per-layer modules of ``stage`` that FSDP shards as their own units (the stage module is
        the root unit holding the rest)."""
        ...

    def checkpoint_parts(self, name: str, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The checkpoint ``(name, tensor)`` entries of parameter (or optimizer state) ``name``, so TP
        and non-TP runs save the same tensors. Default: ``[(name, t)]``."""
        ...

    def fuse_parts(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Inverse of ``checkpoint_parts`` over whole parameters (name -> tensor). Default: identity."""
        ...

    # --- processing rules: what the renderer and the LLM stages see of a sample ---------------------
    def image_grids(self, cfg: Any, meta: SampleMeta) -> tuple[tuple[int, int, int], ...]:
        """Per image of ``meta``, its ``(t, h, w)`` encoder grid: ``t*h*w`` encoder input rows (patches,
        or tiles x patches per tile with ``t`` = tiles)."""
        ...

    def image_feature_rows(self, cfg: Any, grid: tuple[int, int, int]) -> int:
        """Image feature rows (= image placeholder tokens in the LLM sequence) of one image's grid."""
        ...

    def image_extras(self, cfg: Any, meta: SampleMeta) -> tuple[tuple[int, ...], ...]:
        """Optional. Per image of ``meta``, the extra int columns the encoder stages receive after its
        ``(t, h, w)`` grid row (same count for every image; e.g. the original ``(H, W)`` AnyRes
        unpads by). Default: ``()`` (none)."""
        ...

    def sample_feature_rows(self, cfg: Any, meta: SampleMeta) -> tuple[int, ...]:
        """Optional. Image feature rows per image of ``meta`` (what the renderer lays out), for a family
        whose count needs more than the grid (the original size, the sample's other images).
        Default: ``image_feature_rows`` of each of ``image_grids``."""
        ...

    def encoder_input_width(self, cfg: Any) -> int:
        """Columns of one encoder input row (flattened patch values, e.g. 3*2*14*14 = 1176)."""
        ...

    def token_ids(self, cfg: Any) -> dict[str, int]:
        """The model-vocabulary ids of the special tokens the sample layout uses: ``image`` (the
        placeholder one image feature row replaces), ``image_start``, ``image_end`` (-1: none)."""
        ...

    def map_token_id(self, cfg: Any, text_id: int) -> int:
        """An id of Entrain's built-in text tokenizer (``entrain.data.tokenizer``: what it and synthetic
        text produce, Qwen2's vocabulary) in the model's vocabulary."""
        ...

    def format_chat(
        self, cfg: Any, turns: Sequence, image_tokens: Sequence[int], tokenizer: Any
    ) -> tuple[list[int], list[int]]:
        """``(input_ids, labels)`` of a real conversation (``entrain.data.records.Record.turns``) whose
        i-th image has ``image_tokens[i]`` placeholder tokens: the family's chat template, labels -100
        outside the assistant turns. ValueError for a conversation that does not fit its images."""
        ...

    def process_images(self, cfg: Any, images: Sequence, rule: ImageTokenRule) -> tuple[Any, Any]:
        """``(pixel_values [N, encoder_input_width] float32, grids [images, 3] int64)`` numpy arrays of
        decoded PIL ``images`` through the family's image processor, within ``rule``'s limits; the grids
        equal ``image_grids`` of the images' sizes. ValueError for an image it refuses."""
        ...

    def position_ids(self, cfg: Any, samples: Sequence[PackedSample]) -> torch.Tensor:
        """The LLM position ids of a packed batch of ``samples`` (concatenated in order), int64 on the
        CPU: ``[T]`` (1-D rotary: ``0..L-1`` restarting per sample) or ``[3, T]`` (M-RoPE: temporal,
        height, width ids, restarting per sample). The LLM stages receive them as ``batch.position_ids``."""
        ...

    # --- profiler (entrain profile) ----------------------------------------------------------------
    def representative_config(self, cfg: Any) -> tuple[Any, dict[str, dict[int, int]]]:
        """``(small_cfg, reps)``: a reduced model config with one layer per distinct layer kind, and per
        component the map from each layer index of ``cfg``'s lists to the index of the small model's
        layer timed for it (same kind). The profiler times the small model only."""
        ...

    def profile_input(
        self, cfg: Any, component: str, layer: int, tokens: int, device: torch.device, per_label: bool
    ) -> tuple[tuple, int]:
        """``(forward args, units)``: inputs of a one-layer stage ``[layer, layer + 1)`` of ``component``
        for one sequence unit of about ``tokens`` tokens (an image of ~``tokens`` encoder rows, or a
        sample of ``tokens`` LLM tokens; ``per_label``: every token is a label), and the unit's exact
        token count (what the timing is fitted against). Tensors needing gradients have them."""
        ...

    # --- export ----------------------------------------------------------------------------------
    def export(self, manifest: dict, params: dict[str, torch.Tensor], out_dir: str) -> dict:
        """Write a run's trained weights ``params`` (the model's parameter names, fused by
        ``fuse_parts``; ``manifest``: the checkpoint manifest with ``model``, ``model_source``) as
        Hugging Face folder(s) under ``out_dir`` that transformers loads with ``from_pretrained``
        (tokenizer/processor files included for a checkpoint-folder model). Returns the summary fields
        it adds to ``entrain_export.json``: ``files`` (every file written), ``image_token_id``, and the
        folder(s) written (a composition: ``vision`` and ``llm``; a whole model: ``model``)."""
        ...


class FamilyBase:
    """Defaults of ``ModelFamily``'s optional methods (torch imported lazily). A family subclasses this
    and implements the rest; ``register_family`` refuses one that lacks a member, naming it.

    No default speaks for a model: what a sample becomes (``image_rule``, ``token_ids``,
    ``map_token_id``) has none, and ``format_chat`` / ``process_images`` / ``export`` /
    ``profile_input`` default to a ``ConfigError`` naming the family and the member (a family may train
    on synthetic data only). The defaults that remain are model-neutral: no presets, no tensor
    parallelism, 1-D positions, no extra grid columns, checkpoint names as they are."""

    name = ""
    description = ""
    accepts_audio = False
    """Whether the family reads audio clips (``SampleMeta.audio``; its ``audio_input_width`` and the
    ``audio`` / ``audio_start`` / ``audio_end`` ``token_ids``); records with audio are refused for others."""
    accepts_video = False
    """Whether the family reads videos (``SampleMeta.video``; its ``video_settings``, ``video_text``,
    ``second_per_grid`` and the ``video`` ``token_ids``); records with videos are refused for others."""
    encoder_parts: dict[str, tuple[str, str]] = {}
    """A plan with several encoder pipelines (``StageSpec.encoder``): per encoder name, the part of the
    first LLM stage's input its output becomes and that part's rows per sample (``MessagePart.rows``:
    ``image_tokens`` or ``audio_tokens``). Optional, not part of ``ModelFamily``. Default: none (the
    family runs one encoder component)."""

    def preset_names(self) -> tuple[str, ...]:
        return ()

    def claims_config(self, config: dict) -> bool:
        return False

    def model_types(self) -> tuple[str, ...]:
        """The ``config.json`` ``model_type`` values whose folders ``claims_config`` accepts (what
        ``entrain data families`` lists); optional, not part of ``ModelFamily``. Default: none."""
        return ()

    def code_names(self) -> tuple[str, ...]:
        """Default: the registry name only."""
        return (self.name,)

    def layer_names(self, shape: ModelShape, component: str) -> list[str]:
        """Default: the ``LayerSpec.name`` of each of ``shape.layer_specs()[component]``."""
        return [s.name for s in shape.layer_specs()[component]]

    def check_tp(self, shape: ModelShape, tp: int) -> None:
        if tp != 1:
            raise ConfigError(f"--tp {tp}: model family {self.name!r} has no tensor-parallel plan")

    def prepare_for_sharding(self, stage: nn.Module) -> None:
        return None

    def empty_model(self, cfg: Any) -> nn.Module:
        """Default: ``build_model(cfg)`` (a seeded random model)."""
        return self.build_model(cfg)

    def apply_tp(self, stage: nn.Module, mesh: Any) -> None:
        raise NotImplementedError(f"model family {self.name!r} has no tensor-parallel plan")

    def checkpoint_parts(self, name: str, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        return [(name, t)]

    def fuse_parts(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(params)

    def image_extras(self, cfg: Any, meta: SampleMeta) -> tuple[tuple[int, ...], ...]:
        return ()

    def sample_feature_rows(self, cfg: Any, meta: SampleMeta) -> tuple[int, ...]:
        return tuple(self.image_feature_rows(cfg, g) for g in self.image_grids(cfg, meta))

    def format_chat(
        self, cfg: Any, turns: Sequence, image_tokens: Sequence[int], tokenizer: Any
    ) -> tuple[list[int], list[int]]:
        """Default: none. A family that trains on real conversations implements its chat template (the
        Qwen families: ``entrain.models.families.qwen2_vl.processing.format_chat``)."""
        raise ConfigError(_missing(self, "format_chat", "no chat template: it trains on synthetic data only"))

    def process_images(self, cfg: Any, images: Sequence, rule: ImageTokenRule) -> tuple[Any, Any]:
        """Default: none. A family that trains on real images implements its image processor (the Qwen
        families: ``entrain.models.families.qwen2_vl.processing``)."""
        raise ConfigError(
            _missing(self, "process_images", "no image processor: it trains on synthetic data only")
        )

    def image_processing(
        self, rule: ImageTokenRule
    ) -> Callable[[Sequence, ImageTokenRule], tuple[Any, Any]] | None:
        """The image processor ``entrain data check`` runs on every image, without a model config:
        ``(images, rule) -> (pixel_values, image_grid_thw)`` (``entrain.data.processing.ProcessImages``),
        built now, so a sharded check's forked workers share it; None when the family has none that
        runs without a checkpoint (token counts then come from ``rule``). Optional, not part of
        ``ModelFamily``. Default: None."""
        return None

    def position_ids(self, cfg: Any, samples: Sequence[PackedSample]) -> torch.Tensor:
        """Default: 1-D ``0..L-1`` per sample, concatenated (``[T]``)."""
        import torch

        if not samples:
            return torch.zeros(0, dtype=torch.int64)
        return torch.cat([torch.arange(int(s.input_ids.numel())) for s in samples])

    def representative_config(self, cfg: Any) -> tuple[Any, dict[str, dict[int, int]]]:
        """Default: the model itself, every layer timed as itself."""
        return cfg, {c: {i: i for i in range(len(self.layer_names(cfg.shape, c)))} for c in COMPONENTS}

    def profile_input(self, cfg: Any, component: str, layer: int, tokens: int, device: Any, per_label: bool):
        raise ConfigError(f"model family {self.name!r} cannot be profiled (it has no profile_input)")

    def export(self, manifest: dict, params: dict[str, torch.Tensor], out_dir: str) -> dict:
        raise ConfigError(f"model family {self.name!r} has no export")


def _missing(family: Any, member: str, what: str) -> str:
    """The error of a family without an optional member: the family, the member and what it lacks."""
    return f"model family {family.name!r} ({type(family).__name__}) implements no {member} ({what})"
