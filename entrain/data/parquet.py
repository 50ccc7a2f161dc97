"""FineVision / The Cauldron style Parquet datasets, streamed one row group at a time (pyarrow).

Schema: ``images``: list of ``{bytes, path}`` (either set), ``texts``: list of
``{user, assistant[, source]}``; an optional ``id`` column. Rows carry no ``<image>`` placeholders:
the images go before the first user message (Qwen's layout), so the record gets one placeholder per
image at the start of its first user turn. Records without ``id`` get ``"<file stem>:<row>"``.
Relative image paths resolve against ``image_root`` or the file's folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from entrain.core.errors import ConfigError
from entrain.data.problems import ASSISTANT_IMAGE, unread
from entrain.data.records import IMAGE_PLACEHOLDER, Parsed, Record

__all__ = ["iter_parquet"]


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise ConfigError(
            "reading Parquet datasets needs the package 'pyarrow': pip install pyarrow"
        ) from None
    return pq


def _images(value: Any, base: Path, problems: list[tuple[str, str]]) -> list[str | bytes]:
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(("images", f"must be a list, got {type(value).__name__}"))
        return []
    out: list[str | bytes] = []
    for i, img in enumerate(value):
        fld = f"images[{i}]"
        data = img.get("bytes") if isinstance(img, dict) else img if isinstance(img, bytes) else None
        path = img.get("path") if isinstance(img, dict) else img if isinstance(img, str) else None
        if data:
            out.append(bytes(data))
        elif path:
            p = Path(path)
            out.append(str(p if p.is_absolute() else base / p))
        else:
            problems.append((fld, "neither image bytes nor a path"))
    return out


def _turns(value: Any, problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    if not isinstance(value, list) or not value:
        problems.append(("texts", "missing or empty"))
        return []
    turns: list[tuple[str, str]] = []
    for i, t in enumerate(value):
        if not isinstance(t, dict):
            problems.append((f"texts[{i}]", f"must be an object, got {type(t).__name__}"))
            continue
        for key, role in (("user", "user"), ("assistant", "assistant")):
            text = t.get(key)
            if not isinstance(text, str) or not text.strip():
                problems.append((f"texts[{i}].{key}", "missing or empty"))
            elif role == "assistant" and IMAGE_PLACEHOLDER in text:
                problems.append((f"texts[{i}].{key}", ASSISTANT_IMAGE))
            else:
                turns.append((role, text))
    return turns


def _row(row: dict, file: str, index: int, stem: str, base: Path) -> Parsed:
    problems: list[tuple[str, str]] = []
    rid = row.get("id")
    rid = f"{stem}:{index}" if rid is None or rid == "" else str(rid)
    images = _images(row.get("images"), base, problems)
    turns = _turns(row.get("texts"), problems)
    placeholders = sum(text.count(IMAGE_PLACEHOLDER) for _, text in turns)
    if not problems and placeholders == 0 and images:
        role, text = turns[0]
        turns[0] = (role, IMAGE_PLACEHOLDER * len(images) + text)
    elif not problems and placeholders != len(images):
        problems.append(
            ("texts", f"{placeholders} {IMAGE_PLACEHOLDER} placeholder(s) but {len(images)} image(s)")
        )
    record = None if problems else Record(rid, tuple(images), tuple(turns), file, index, None)
    return Parsed(file, index, None, rid, record, problems)


def iter_parquet(
    path: str | Path, image_root: str | Path | None = None, batch_rows: int = 256
) -> Iterator[Parsed]:
    """Parse every row of a FineVision-style Parquet file, streaming ``batch_rows`` rows at a time."""
    pq = _pyarrow_parquet()
    p = Path(path)
    base = Path(image_root) if image_root is not None else p.parent
    try:
        pf = pq.ParquetFile(p)
    except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid/OSError for a bad file
        reason = f"not a readable Parquet file (cut off or corrupt?): {e}; {unread(0)}"
        yield Parsed(str(p), 0, None, None, None, [("parquet", reason)], True)
        return
    names = set(pf.schema_arrow.names)
    missing = [c for c in ("images", "texts") if c not in names]
    if missing:
        reason = f"Parquet column missing (the file has {', '.join(sorted(names)) or 'no columns'})"
        yield Parsed(str(p), 0, None, None, None, [(missing[0], reason)], True)
        return
    columns = [c for c in ("id", "images", "texts") if c in names]
    index = 0
    for group in range(pf.num_row_groups):
        batches = pf.iter_batches(batch_size=batch_rows, row_groups=[group], columns=columns)
        while True:
            try:
                batch = next(batches, None)
                rows = None if batch is None else batch.to_pylist()
            except Exception as e:  # noqa: BLE001 - a corrupt page: pyarrow's OSError/ArrowInvalid
                error = " ".join(str(e).split())
                reason = f"Parquet row group {group} unreadable after row {index}: {error}; {unread(index)}"
                yield Parsed(str(p), index, None, None, None, [("parquet", reason)], True)
                return
            if rows is None:
                break
            for row in rows:
                yield _row(row, str(p), index, p.stem, base)
                index += 1
    if index != pf.metadata.num_rows:
        reason = f"Parquet file declares {pf.metadata.num_rows} rows but holds {index}; {unread(index)}"
        yield Parsed(str(p), index, None, None, None, [("parquet", reason)], True)
