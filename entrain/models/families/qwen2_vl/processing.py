"""Qwen2-VL's processing rules (torch-free at import): what a sample becomes for a model whose vision
tower is Qwen2-VL's / Qwen2.5-VL's (the ``qwen2_vl`` family, the composition, and families built on
them). Nothing here is a default of the seam: each family that uses these says so in its own methods.

* Tokens: the Qwen2 tokenizer's ``<|image_pad|>``, ``<|vision_start|>``, ``<|vision_end|>``
  (``token_ids``).
* Chat: the tokenizer's own chat template, else Qwen2's ``<|im_start|>`` markers, each image
  ``<|vision_start|>`` + n x ``<|image_pad|>`` + ``<|vision_end|>`` (``format_chat``).
* Images: transformers' ``Qwen2VLImageProcessorPil`` (the image processor Qwen2.5-VL uses; PIL
  backend, no torchvision) does the ``smart_resize``, normalisation and patching of images
  ``entrain.data.processing.load_image`` decoded to RGB8, with the checkpoint's
  ``preprocessor_config.json`` settings (``image_mean`` / ``image_std`` included). ``transformers`` is
  imported only when images are processed.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from entrain.core.errors import ConfigError
from entrain.core.workload.samples import DEFAULT_VISION, VisionTokenConfig

__all__ = [
    "VISION_TOKENS",
    "image_processor",
    "process_images",
    "folder_settings",
    "processor_settings",
    "token_ids",
    "format_chat",
    "process_folder_images",
    "image_processing",
    "Qwen2VLProcessing",
]

VISION_TOKENS = {"image": "<|image_pad|>", "image_start": "<|vision_start|>", "image_end": "<|vision_end|>"}
"""The Qwen2 tokenizer's image placeholder and vision markers (``ModelFamily.token_ids`` keys)."""


PIXEL_SETTINGS = ("image_mean", "image_std", "do_rescale", "rescale_factor", "do_normalize", "resample",
                  "do_convert_rgb")  # fmt: skip
"""The ``preprocessor_config.json`` fields besides the pixel limits that change the pixels the model
sees, handed to the image processor as they are."""

_GEOMETRY = ("patch_size", "merge_size", "temporal_patch_size")
"""Fields that must equal the vision tower's (its config.json): the processor cannot cut other patches."""

_CANNOT_HONOUR = {"do_resize": False}
"""Values the training processor cannot honour (Qwen's ``smart_resize`` is what sizes an image's patches)."""


def processor_settings(folder: str, geometry: tuple[int, int, int]) -> tuple[tuple[str, object], ...]:
    """The ``PIXEL_SETTINGS`` of the folder's ``preprocessor_config.json`` as ``(key, value)`` pairs
    (hashable; lists as tuples); () without the file. ConfigError naming the file and field for patch
    geometry other than ``geometry`` (``patch_size``, ``merge_size``, ``temporal_patch_size`` of the
    vision tower) or a value the processor cannot honour."""
    path = os.path.join(folder, "preprocessor_config.json")
    if not os.path.isfile(path):
        return ()
    try:
        with open(path, encoding="utf-8") as f:
            proc = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read it ({e})") from None
    if not isinstance(proc, dict):
        raise ConfigError(f"{path}: not a JSON object")
    for key, want in zip(_GEOMETRY, geometry):
        if key in proc and proc[key] != want:
            raise ConfigError(
                f"{path}: {key} {proc[key]!r} differs from the vision tower's {want} (config.json): the model "
                "cannot see the patches this processor cuts"
            )
    for key, bad in _CANNOT_HONOUR.items():
        if proc.get(key, not bad) == bad:
            raise ConfigError(f"{path}: {key} {bad!r} is not supported (training resizes every image)")
    return tuple(
        (k, tuple(proc[k]) if isinstance(proc[k], list) else proc[k]) for k in PIXEL_SETTINGS if k in proc
    )


@functools.cache
def folder_settings(folder: str | None, vision: VisionTokenConfig) -> tuple:
    """The pixel settings of checkpoint ``folder``'s ``preprocessor_config.json`` (read once per
    folder and rule; () for no folder)."""
    if folder is None:
        return ()
    patch = vision.factor // vision.merge_size
    return processor_settings(folder, (patch, vision.merge_size, vision.temporal_patch_size))


@functools.cache
def image_processor(vision: VisionTokenConfig = DEFAULT_VISION, settings: tuple = ()):
    """The Qwen2.5-VL image processor (PIL backend) configured with ``vision``'s pixel limits and
    patch geometry and the checkpoint's ``settings`` (``processor_settings``: normalisation,
    rescaling, resampling of its ``preprocessor_config.json``)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        **dict(settings),
        min_pixels=vision.min_pixels,
        max_pixels=vision.max_pixels,
        patch_size=vision.factor // vision.merge_size,
        merge_size=vision.merge_size,
        temporal_patch_size=vision.temporal_patch_size,
    )


def process_images(
    images: Sequence, vision: VisionTokenConfig = DEFAULT_VISION, settings: tuple = ()
) -> tuple[np.ndarray, np.ndarray]:
    """``(pixel_values [sum of patches, 3*2*14*14] float32, image_grid_thw [n, 3] int64)``."""
    out = image_processor(vision, settings)(images=list(images), return_tensors="np")
    return np.asarray(out["pixel_values"], dtype=np.float32), np.asarray(
        out["image_grid_thw"], dtype=np.int64
    )


def token_ids(map_token_id: Callable[[int], int]) -> dict[str, int]:
    """``VISION_TOKENS``' Qwen2-tokenizer ids mapped into a model's vocabulary by ``map_token_id``."""
    from entrain.data.tokenizer import QWEN2_SPECIAL_TOKENS

    return {k: map_token_id(QWEN2_SPECIAL_TOKENS[v]) for k, v in VISION_TOKENS.items()}


def format_chat(turns: Sequence, image_tokens: Sequence[int], tokenizer: Any) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)``: the tokenizer's chat template when it has one, Qwen2's otherwise, each
    image as ``<|vision_start|>`` + n x ``<|image_pad|>`` + ``<|vision_end|>``
    (``entrain.data.processing.format_chat``)."""
    from entrain.data.processing import format_chat as chat

    return chat(turns, image_tokens, tokenizer)


def process_folder_images(folder: str | None, images: Sequence, vision: VisionTokenConfig):
    """``process_images`` with checkpoint ``folder``'s ``preprocessor_config.json`` settings (None: the
    processor's own defaults)."""
    return process_images(images, vision, folder_settings(folder, vision))


def image_processing(rule) -> Callable | None:
    """``ModelFamily.image_processing``: this processor, built now, for a ``smart_resize`` rule
    (``VisionTokenConfig``); None for any other rule."""
    if not isinstance(rule, VisionTokenConfig):
        return None
    image_processor(rule)
    return process_images


class Qwen2VLProcessing:
    """The ``ModelFamily`` members of a family whose samples are Qwen2-VL's (a mixin before
    ``FamilyBase``): ``format_chat``, ``process_images`` (with ``processor_folder(cfg)``'s
    ``preprocessor_config.json``) and ``image_processing``. ``token_ids`` stays the family's own (the
    checkpoint's ids, or ``token_ids`` above through its ``map_token_id``)."""

    def processor_folder(self, cfg: Any) -> str | None:
        """The folder whose ``preprocessor_config.json`` the image processor follows: the checkpoint's."""
        return cfg.folder

    def format_chat(self, cfg: Any, turns, image_tokens, tokenizer) -> tuple[list[int], list[int]]:
        """The checkpoint tokenizer's chat template (else Qwen2's); images between the vision markers."""
        return format_chat(turns, image_tokens, tokenizer)

    def process_images(self, cfg: Any, images, rule) -> tuple[np.ndarray, np.ndarray]:
        """Qwen2-VL's image processor with ``processor_folder(cfg)``'s settings."""
        return process_folder_images(self.processor_folder(cfg), images, rule)

    def image_processing(self, rule):
        return image_processing(rule)
