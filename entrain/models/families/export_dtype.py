"""The dtype an export's weights are written in (``entrain export --dtype``).

Training keeps float32 master weights, and every family's export writes them as float32. A published
checkpoint is usually bfloat16: ``cast_export`` rewrites every safetensors file an export wrote with
its floating tensors in the chosen dtype (integer tensors as they are), the total size of a sharded
checkpoint's index, and the ``dtype`` of every ``config.json`` (and of its sub-configs), so that
``from_pretrained(..., dtype="auto")`` loads the weights in that dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["EXPORT_DTYPES", "DEFAULT_EXPORT_DTYPE", "cast_export"]

EXPORT_DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_EXPORT_DTYPE = "float32"
"""The trained master weights as they are."""


def _cast_file(path: Path, dtype) -> int:
    """Rewrite one safetensors file with its floating tensors in ``dtype``; its tensors' bytes."""
    from safetensors.torch import load_file, save_file

    tensors = {k: (t.to(dtype) if t.is_floating_point() else t) for k, t in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _set_config_dtype(config: dict, name: str) -> None:
    for key in ("dtype", "torch_dtype"):
        if key in config:
            config[key] = name
    for value in config.values():
        if isinstance(value, dict):
            _set_config_dtype(value, name)


def cast_export(out_dir: str | Path, name: str) -> None:
    """The export under ``out_dir`` with its weights in dtype ``name`` (one of ``EXPORT_DTYPES``)."""
    import torch

    if name not in EXPORT_DTYPES:
        raise ValueError(f"dtype {name!r}: choose from {', '.join(EXPORT_DTYPES)}")
    if name == DEFAULT_EXPORT_DTYPE:
        return
    dtype = getattr(torch, name)
    for folder in sorted({p.parent for p in Path(out_dir).rglob("*.safetensors")}):
        sizes = {p.name: _cast_file(p, dtype) for p in sorted(folder.glob("*.safetensors"))}
        for index in folder.glob("*.safetensors.index.json"):
            data = json.loads(index.read_text())
            data.setdefault("metadata", {})["total_size"] = sum(sizes.values())
            index.write_text(json.dumps(data, indent=2) + "\n")
        config = folder / "config.json"
        if config.exists():
            data = json.loads(config.read_text())
            _set_config_dtype(data, name)
            config.write_text(json.dumps(data, indent=2) + "\n")
