"""On-disk cache of a dataset file's per-sample metadata.

One JSONL file per dataset file: a header line holding the key (the data file's absolute path,
size in bytes and mtime in ns, plus the image root, tokenizer and vision limits that the metadata
depends on), a line with every image file's size in bytes and mtime in ns (``{"images": {path:
[size_bytes, mtime_ns]}}``), then one ``SampleMeta.to_json()`` per line. The cache lives in
``.entrain_cache/`` next to the data file, or in a given folder. It is used only while the key and
every image's size and mtime are unchanged (an image replaced in place invalidates it); a stale or
unreadable cache is ignored and rewritten, and deleting the folder is always safe.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

from entrain.core.workload.samples import SampleMeta, VisionTokenConfig

__all__ = ["CACHE_DIRNAME", "cache_key", "cache_path", "file_stamp", "load", "store"]

CACHE_DIRNAME = ".entrain_cache"
_VERSION = 7
"""4: image sizes after the EXIF orientation, and no image over the aspect-ratio limit; 5: no record
with a video / audio input or a media path in a field no reader reads (those are bad records now); 6:
records with audio clips (their mel frames, each file stamped beside the images); 7: a video's audio
track decoded with its frames (a record feeding a cut or corrupt one is bad)."""


def file_stamp(path: str | Path) -> list[int] | None:
    """``[size_bytes, mtime_ns]`` of a file (None if it cannot be stat'ed): what the cache compares."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def cache_key(
    path: str | Path, image_root: str | Path | None, tokenizer: str, vision: VisionTokenConfig
) -> dict:
    """What the cached metadata of ``path`` depends on."""
    p = Path(path).resolve()
    st = p.stat()
    return {
        "version": _VERSION,
        "path": str(p),
        "size_bytes": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "image_root": None if image_root is None else str(Path(image_root).resolve()),
        "tokenizer": tokenizer,
        "vision": asdict(vision),
    }


def cache_path(path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Where ``path``'s metadata cache lives."""
    p = Path(path).resolve()
    folder = Path(cache_dir) if cache_dir is not None else p.parent / CACHE_DIRNAME
    digest = hashlib.sha1(str(p).encode()).hexdigest()[:12]
    return folder / f"{p.name}.{digest}.meta.jsonl"


def load(
    path: str | Path, key: dict, vision: VisionTokenConfig, cache_dir: str | Path | None = None
) -> list[SampleMeta] | None:
    """The cached metadata if the cache exists, its key equals ``key`` and every image file still has
    the size and mtime it had when the cache was written; else None."""
    file = cache_path(path, cache_dir)
    try:
        with open(file, encoding="utf-8") as f:
            if json.loads(f.readline()) != key:
                return None
            stamps = json.loads(f.readline())["images"]
            if any(file_stamp(image) != stamp for image, stamp in stamps.items()):
                return None
            out = []
            for line in f:
                out.append(SampleMeta.from_json(json.loads(line), vision))
            return out
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(
    path: str | Path,
    key: dict,
    samples: list[SampleMeta],
    cache_dir: str | Path | None = None,
    image_stamps: dict[str, list[int] | None] | None = None,
) -> Path | None:
    """Write the cache atomically; returns its path, or None where the folder is not writable.
    ``image_stamps``: ``file_stamp`` of every image file, taken before its header was read."""
    file = cache_path(path, cache_dir)
    tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(key, sort_keys=True) + "\n")
            f.write(json.dumps({"images": image_stamps or {}}, separators=(",", ":")) + "\n")
            for s in samples:
                f.write(json.dumps(s.to_json(), separators=(",", ":")) + "\n")
        os.replace(tmp, file)
    except OSError:
        tmp.unlink(missing_ok=True)
        return None
    return file
