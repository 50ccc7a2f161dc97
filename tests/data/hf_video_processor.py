"""Transformers' own Qwen2-VL video processor (``Qwen2VLVideoProcessor``, the one Qwen2.5-VL and the
Qwen2.5-Omni processor use) on video files, run in a child process by the tests:
``python tests/data/hf_video_processor.py OUT.npz [--qwen3] VIDEO...`` (``--qwen3``: Qwen3-VL's
``Qwen3VLVideoProcessor``) writes each video's
``pixel_values_videos`` and ``video_grid_thw`` and the frame indices its ``sample_frames`` kept (2 fps),
the frames read by transformers' ``load_video`` with its PyAV backend.

The video processor imports torchvision, which this environment lacks (its PyPI wheel is a CUDA
build that does not load beside the CPU torch). Where torchvision is missing, a stand-in provides
only what the processor's code path calls: ``resize`` for frames already at the size it asks (the
tests' videos are: multiples of 28 within the pixel limits, so the real one returns them as they
are; any other size raises), ``normalize`` as torchvision's arithmetic, ``grayscale_to_rgb`` for RGB
frames. Everything else (frame sampling, ``smart_resize``, the fused rescale, the temporal padding and
``patchify``) is transformers' code. With torchvision installed the real one runs instead."""

from __future__ import annotations

import enum
import importlib.util
import os
import sys
import types
from functools import partial


def _stand_in() -> None:
    import torch

    names = ["torchvision", "torchvision.transforms", "torchvision.transforms.v2",
             "torchvision.transforms.v2.functional", "torchvision.io"]  # fmt: skip
    mods = {n: types.ModuleType(n) for n in names}
    for n, m in mods.items():
        m.__spec__ = importlib.machinery.ModuleSpec(n, None)
    functional = mods["torchvision.transforms.v2.functional"]

    class InterpolationMode(enum.Enum):
        NEAREST = "nearest"
        NEAREST_EXACT = "nearest-exact"
        BILINEAR = "bilinear"
        BICUBIC = "bicubic"
        BOX = "box"
        HAMMING = "hamming"
        LANCZOS = "lanczos"

    def resize(image, size, interpolation=None, antialias=True, **_):
        if list(image.shape[-2:]) != list(size):
            raise NotImplementedError(
                f"the torchvision stand-in resizes nothing ({tuple(image.shape[-2:])} -> {size})"
            )
        return image

    def normalize(tensor, mean, std, inplace=False):
        out = tensor if inplace else tensor.clone()
        mean = torch.as_tensor(mean, dtype=out.dtype).view(-1, 1, 1)
        std = torch.as_tensor(std, dtype=out.dtype).view(-1, 1, 1)
        return out.sub_(mean).div_(std)

    functional.InterpolationMode = InterpolationMode
    functional.resize, functional.normalize = resize, normalize
    functional.grayscale_to_rgb = lambda video: video
    mods["torchvision.transforms"].InterpolationMode = InterpolationMode
    mods["torchvision"].transforms = mods["torchvision.transforms"]
    mods["torchvision.transforms"].v2 = mods["torchvision.transforms.v2"]
    mods["torchvision.transforms.v2"].functional = functional
    mods["torchvision"].io = mods["torchvision.io"]
    sys.modules.update(mods)
    import transformers.image_processing_backends as backends
    import transformers.video_processing_utils as video_utils
    from transformers.image_utils import PILImageResampling

    for module in (backends, video_utils):  # they import torchvision only where transformers finds it
        module.tvF = functional
    backends.pil_torch_interpolation_mapping = {
        PILImageResampling.NEAREST: InterpolationMode.NEAREST_EXACT,
        PILImageResampling.BOX: InterpolationMode.BOX,
        PILImageResampling.BILINEAR: InterpolationMode.BILINEAR,
        PILImageResampling.HAMMING: InterpolationMode.HAMMING,
        PILImageResampling.BICUBIC: InterpolationMode.BICUBIC,
        PILImageResampling.LANCZOS: InterpolationMode.LANCZOS,
    }


PROCESSORS = {"qwen2": ("qwen2_vl", "Qwen2VLVideoProcessor"), "qwen3": ("qwen3_vl", "Qwen3VLVideoProcessor")}


def processor_class(kind: str = "qwen2"):
    """``Qwen2VLVideoProcessor`` or ``Qwen3VLVideoProcessor`` (the stand-in's module where torchvision
    is missing)."""
    folder, name = PROCESSORS[kind]
    try:
        import torchvision  # noqa: F401
        import transformers

        return getattr(transformers, name)
    except ImportError:
        pass
    import transformers

    _stand_in()
    path = os.path.join(
        os.path.dirname(transformers.__file__), f"models/{folder}/video_processing_{folder}.py"
    )
    spec = importlib.util.spec_from_file_location(
        f"transformers.models.{folder}.video_processing_{folder}", path
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return getattr(module, name)


def main(out: str, paths: list[str]) -> None:
    import numpy as np
    from transformers.video_utils import load_video

    kind = "qwen2"
    if paths and paths[0] in ("--qwen2", "--qwen3"):
        kind, paths = paths[0][2:], paths[1:]
    proc = processor_class(kind)(cap_pixels_per_frame=False)
    arrays = {}
    for i, path in enumerate(paths):
        frames, meta = load_video(
            path, backend="pyav", sample_indices_fn=partial(proc.sample_frames, fps=2.0)
        )
        got = proc(videos=[frames], do_sample_frames=False, return_tensors="pt")
        arrays[f"pixels{i}"] = got["pixel_values_videos"].numpy()
        arrays[f"grid{i}"] = got["video_grid_thw"].numpy()
        arrays[f"indices{i}"] = np.asarray(meta.frames_indices)
    np.savez(out, **arrays)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
