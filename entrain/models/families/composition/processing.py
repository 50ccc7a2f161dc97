"""The composition's image processing (torch-free at import): transformers' ``Qwen2VLImageProcessorPil``
(the image processor Qwen2.5-VL uses; PIL backend, no torchvision) does the ``smart_resize``,
normalisation and 14x14 patching of images ``entrain.data.processing.load_image`` decoded to RGB8.
``transformers`` is imported only when images are processed."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from entrain.core.samples import DEFAULT_VISION, VisionTokenConfig

__all__ = ["image_processor", "process_images"]


@functools.cache
def image_processor(vision: VisionTokenConfig = DEFAULT_VISION):
    """The Qwen2.5-VL image processor (PIL backend) configured with ``vision``'s pixel limits."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        min_pixels=vision.min_pixels,
        max_pixels=vision.max_pixels,
        patch_size=vision.factor // vision.merge_size,
        merge_size=vision.merge_size,
        temporal_patch_size=vision.temporal_patch_size,
    )


def process_images(
    images: Sequence, vision: VisionTokenConfig = DEFAULT_VISION
) -> tuple[np.ndarray, np.ndarray]:
    """``(pixel_values [sum of patches, 3*2*14*14] float32, image_grid_thw [n, 3] int64)``."""
    out = image_processor(vision)(images=list(images), return_tensors="np")
    return np.asarray(out["pixel_values"], dtype=np.float32), np.asarray(
        out["image_grid_thw"], dtype=np.int64
    )
