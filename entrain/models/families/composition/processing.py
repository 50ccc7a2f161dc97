"""The composition's image processing (torch-free at import): transformers' ``Qwen2VLImageProcessorPil``
(the image processor Qwen2.5-VL uses; PIL backend, no torchvision) does the ``smart_resize``,
normalisation and 14x14 patching of images ``entrain.data.processing.load_image`` decoded to RGB8.
``transformers`` is imported only when images are processed."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence

import numpy as np

from entrain.core.errors import ConfigError
from entrain.core.samples import DEFAULT_VISION, VisionTokenConfig

__all__ = ["image_processor", "process_images", "folder_settings", "processor_settings"]


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
    patch geometry and the checkpoint's ``settings`` (``hf_config.processor_settings``: normalisation,
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
