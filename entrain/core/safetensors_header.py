"""Whether a ``.safetensors`` file is whole, from its header alone (no torch, no tensor read): the
first 8 bytes give the JSON header's length, the header each tensor's byte range after it, so a file
cut off in a copy or download is found before any process starts loading it. The same headers give a
checkpoint folder's content fingerprint (``checkpoint_fingerprint``): what a plan and a run bind to."""

from __future__ import annotations

import hashlib
import json
import os
import struct

from entrain.core.errors import ConfigError

__all__ = [
    "MAX_HEADER_BYTES",
    "FINGERPRINTED_FILES",
    "checkpoint_fingerprint",
    "safetensors_files",
    "safetensors_problem",
]

MAX_HEADER_BYTES = 100 * 2**20
"""The safetensors format's own limit on the JSON header (100 MB)."""


def _data_end(header: dict) -> int:
    """The end offset of the last tensor's bytes (relative to the data start); ValueError if malformed."""
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(x, int) for x in offsets)):
            raise ValueError(f"tensor {name!r} has no [begin, end] data_offsets")
        end = max(end, offsets[1])
    return end


def safetensors_problem(path: str | os.PathLike) -> str | None:
    """None if ``path`` is a whole safetensors file, else what is wrong (truncated, bad header)."""
    try:
        size_bytes = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                return f"truncated: {size_bytes} bytes, shorter than the 8-byte header length"
            (header_bytes,) = struct.unpack("<Q", prefix)
            if header_bytes > MAX_HEADER_BYTES:
                return f"not a safetensors file (header length {header_bytes} bytes)"
            if 8 + header_bytes > size_bytes:
                return f"truncated: {size_bytes} bytes, but its header alone needs {8 + header_bytes}"
            header = json.loads(f.read(header_bytes))
        if not isinstance(header, dict):
            return "not a safetensors file (its header is not a JSON object)"
        need = 8 + header_bytes + _data_end(header)
    except OSError as e:
        return e.strerror or type(e).__name__
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        return f"not a safetensors file (bad header: {e})"
    if size_bytes < need:
        return f"truncated: {size_bytes} bytes, but its tensors need {need}"
    return None


def safetensors_files(
    folder: str | os.PathLike, subfolders: tuple[str, ...] = ("vision", "llm")
) -> list[str]:
    """The ``.safetensors`` files of a weights ``folder`` and of its ``subfolders`` (sorted paths)."""
    out = []
    for sub in ("", *subfolders):
        where = os.path.join(folder, sub)
        if os.path.isdir(where):
            out += sorted(os.path.join(where, n) for n in os.listdir(where) if n.endswith(".safetensors"))
    return out


FINGERPRINTED_FILES = ("config.json", "preprocessor_config.json")
"""The JSON files of a checkpoint folder that change what the model is or sees (with its tensors)."""


def _header(path: str) -> dict:
    with open(path, "rb") as f:
        (header_bytes,) = struct.unpack("<Q", f.read(8))
        if header_bytes > MAX_HEADER_BYTES:
            raise ValueError(f"header length {header_bytes} bytes")
        header = json.loads(f.read(header_bytes))
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    return header


def checkpoint_fingerprint(folder: str | os.PathLike) -> str:
    """A sha256 of what a checkpoint folder holds, read cheaply: ``FINGERPRINTED_FILES`` (their JSON,
    key order and spacing normalised) and every tensor's name, dtype and shape from the safetensors
    headers (not the tensor bytes; how the tensors are split into shards does not count). ConfigError
    naming the file that cannot be read."""
    content: dict = {"tensors": {}}
    for name in FINGERPRINTED_FILES:
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                content[name] = json.load(f)
        except FileNotFoundError:
            content[name] = None
        except (OSError, ValueError) as e:
            raise ConfigError(f"{path}: cannot read it for the checkpoint's fingerprint ({e})") from None
    for path in safetensors_files(folder):
        try:
            header = _header(path)
        except (OSError, ValueError, struct.error) as e:
            raise ConfigError(f"{path}: not a readable safetensors file ({e})") from None
        for tensor, entry in header.items():
            if tensor != "__metadata__" and isinstance(entry, dict):
                content["tensors"][tensor] = [entry.get("dtype"), entry.get("shape")]
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
