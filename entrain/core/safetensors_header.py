"""Whether a ``.safetensors`` file is whole, from its header alone (no torch, no tensor read): the
first 8 bytes give the JSON header's length, the header each tensor's byte range after it, so a file
cut off in a copy or download is found before any process starts loading it."""

from __future__ import annotations

import json
import os
import struct

__all__ = ["MAX_HEADER_BYTES", "safetensors_files", "safetensors_problem"]

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
