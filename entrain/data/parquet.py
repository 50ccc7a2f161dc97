"""Parquet datasets, streamed one row group at a time (pyarrow), in two schemas:

- FineVision / The Cauldron: ``images``: list of ``{bytes, path}`` (either set), ``texts``: list of
  ``{user, assistant[, source]}``; an optional ``id`` column. Rows carry no ``<image>`` placeholders:
  the images go before the first user message (Qwen's layout), so the record gets one placeholder
  per image at the start of its first user turn.
- LLaVA fields (a ``conversations`` or ``messages`` column, as Hugging Face exports LLaVA data):
  ``conversations`` as in LLaVA JSON, ``image`` (one) or ``images`` (a list), each a path, encoded
  bytes or ``{bytes, path}`` (the ``datasets`` Image feature); ``audio`` / ``audios`` and ``video`` /
  ``videos`` alike (the ``datasets`` Audio / Video storage, bytes or paths), one ``<audio>`` /
  ``<video>`` placeholder each, read and trained as a JSON record's files are; an optional ``id``
  column.
  ``llava_row`` parses such a row; the ``save_to_disk`` arrow reader (``entrain.data.shards``)
  shares it.

Records without ``id`` get ``"<file stem>:<row>"``. Relative image, audio and video paths resolve against
``image_root`` or the file's folder. File bytes become ``ImageRef`` (row group, row, item), read again
by location when training needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from entrain.core.errors import ConfigError
from entrain.data.conversation import media_problems
from entrain.data.problems import ASSISTANT_IMAGE, unread
from entrain.data.records import IMAGE_PLACEHOLDER, MEDIA_FIELDS, ImageRef, Parsed, Record

__all__ = ["LLAVA_COLUMNS", "iter_parquet", "llava_row"]

LLAVA_COLUMNS = (
    "id",
    "conversations",
    "messages",
    *(k for keys in MEDIA_FIELDS.values() for k in keys),
    "use_audio_in_video",
)
"""The columns of a LLaVA-fields table that the reader uses (its images, audio clips and videos, and
whether its videos' audio tracks are fed too: ``entrain.data.video.AUDIO_IN_VIDEO_FIELD``)."""
FINEVISION_COLUMNS = (
    "id",
    "images",
    "texts",
    *(k for kind, keys in MEDIA_FIELDS.items() if kind != "image" for k in keys),
)
"""The columns of a FineVision-style table that the reader uses (a video or audio column too: its rows are
bad records, that schema has no placeholders to place them)."""

RefOf = Callable[[str, int, bytes], ImageRef]
"""``(column, item index, bytes) -> ImageRef`` of one row's image, audio clip or video."""


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise ConfigError(
            "reading Parquet datasets needs the package 'pyarrow': pip install pyarrow"
        ) from None
    return pq


def _images(
    value: Any, base: Path, problems: list[tuple[str, str]], ref_of: RefOf, column: str = "images"
) -> list[str | ImageRef]:
    if value is None:
        return []
    if column == "image" and not isinstance(value, list):
        value = [value]
    if not isinstance(value, list):
        problems.append((column, f"must be a list, got {type(value).__name__}"))
        return []
    out: list[str | ImageRef] = []
    for i, img in enumerate(value):
        fld = column if column == "image" else f"{column}[{i}]"
        data = img.get("bytes") if isinstance(img, dict) else img if isinstance(img, bytes) else None
        path = img.get("path") if isinstance(img, dict) else img if isinstance(img, str) else None
        if data:
            out.append(ref_of(column, i, bytes(data)))
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


def _row(row: dict, file: str, index: int, stem: str, base: Path, ref_of: RefOf) -> Parsed:
    problems: list[tuple[str, str]] = []
    rid = row.get("id")
    rid = f"{stem}:{index}" if rid is None or rid == "" else str(rid)
    images = _images(row.get("images"), base, problems, ref_of)
    turns = _turns(row.get("texts"), problems)
    problems += media_problems(row, turns, "texts")
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


def _media(value: Any, problems: list[tuple[str, str]], ref_of: RefOf, column: str) -> Any:
    """An audio or video column's value as ``parse_record`` reads it: each file's bytes (or the
    ``datasets`` storage ``{bytes, path}`` with bytes) as ``ref_of(column, i, bytes)``, named by its
    path, a path as itself; a list stays a list, one value stays one (its field is then ``column``)."""
    listed = isinstance(value, list)
    out: list = []
    for i, item in enumerate(value if listed else [value]):
        data = item.get("bytes") if isinstance(item, dict) else item if isinstance(item, bytes) else None
        path = item.get("path") if isinstance(item, dict) else item if isinstance(item, str) else None
        if data:
            ref = ref_of(column, i, bytes(data))
            out.append(replace(ref, name=path) if isinstance(path, str) and path else ref)
        elif isinstance(path, str) and path.strip():
            out.append(path)
        else:
            problems.append((f"{column}[{i}]" if listed else column, "neither file bytes nor a path"))
    return out if listed else out[0] if out else None


def llava_row(row: dict, file: str, index: int, stem: str, base: Path, ref_of: RefOf) -> Parsed:
    """One row with LLaVA fields (``conversations``/``messages``, ``image``/``images``, ``id``):
    image, audio and video bytes become ``ref_of(column, i, bytes)``, paths resolve against ``base``."""
    from entrain.data.conversation import parse_record

    problems: list[tuple[str, str]] = []
    obj = {k: v for k, v in row.items() if v is not None and k not in ("image", "images")}
    column = "images" if row.get("images") is not None else "image"
    obj["images"] = _images(row.get(column), base, problems, ref_of, column)
    for kind in ("audio", "video"):
        for key in MEDIA_FIELDS[kind]:
            if row.get(key) is not None:
                obj[key] = _media(row[key], problems, ref_of, key)
    if row.get("id") is None or row.get("id") == "":
        obj["id"] = f"{stem}:{index}"
    parsed = parse_record(obj, file=file, index=index, line=None, base=base, audio_files=True)
    if not problems:
        return parsed
    return Parsed(file, index, None, parsed.id, None, problems + parsed.problems)


def read_columns(schema, wanted: tuple[str, ...]) -> list[str]:
    """The columns of a table (arrow ``schema``) a reader reads: the ``wanted`` ones it has, every other
    column of strings (cheap), and every other column that can hold a file's bytes (binary, or the
    ``datasets`` Image / Audio / Video storage ``{bytes, path}``, or lists of those), so that one
    holding media paths or media bytes under a name no reader uses is named as a problem
    (``media_problems``) instead of ignored."""
    import pyarrow as pa

    def strings(t) -> bool:
        return (
            pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or (pa.types.is_list(t) and strings(t.value_type))
        )

    def files(t) -> bool:
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return True
        if pa.types.is_struct(t):
            return any(t.field(i).name in ("bytes", "path") for i in range(t.num_fields))
        return (pa.types.is_list(t) or pa.types.is_large_list(t)) and files(t.value_type)

    names = set(schema.names)
    return [c for c in wanted if c in names] + [
        f.name for f in schema if f.name not in wanted and (strings(f.type) or files(f.type))
    ]


def _llava_schema(names: set[str]) -> bool:
    return "texts" not in names and ("conversations" in names or "messages" in names)


def iter_parquet(
    path: str | Path, image_root: str | Path | None = None, batch_rows: int = 256
) -> Iterator[Parsed]:
    """Parse every row of a FineVision-style or LLaVA-fields Parquet file, streaming ``batch_rows``
    rows at a time."""
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
    llava = _llava_schema(names)
    missing = [] if llava else [c for c in ("images", "texts") if c not in names]
    if missing:
        reason = f"Parquet column missing (the file has {', '.join(sorted(names)) or 'no columns'})"
        yield Parsed(str(p), 0, None, None, None, [(missing[0], reason)], True)
        return
    wanted = LLAVA_COLUMNS if llava else FINEVISION_COLUMNS
    index = 0
    for group, row_in_group, row in _rows(pf, read_columns(pf.schema_arrow, wanted), batch_rows):
        if isinstance(row, str):
            yield Parsed(str(p), index, None, None, None, [("parquet", f"{row}; {unread(index)}")], True)
            return

        def ref_of(column: str, i: int, data: bytes, g: int = group, r: int = row_in_group) -> ImageRef:
            return ImageRef("parquet", str(p), (g, r, i), column, data)

        parse = llava_row if llava else _row
        yield parse(row, str(p), index, p.stem, base, ref_of)
        index += 1
    if index != pf.metadata.num_rows:
        reason = f"Parquet file declares {pf.metadata.num_rows} rows but holds {index}; {unread(index)}"
        yield Parsed(str(p), index, None, None, None, [("parquet", reason)], True)


def _rows(pf, columns: list[str], batch_rows: int) -> Iterator[tuple[int, int, dict | str]]:
    """``(row group, row in the group, row)`` of every row; a row group that cannot be read ends
    the stream with ``(group, row, why)`` (a string)."""
    index = 0
    for group in range(pf.num_row_groups):
        batches = pf.iter_batches(batch_size=batch_rows, row_groups=[group], columns=columns)
        row_in_group = 0
        while True:
            try:
                batch = next(batches, None)
                rows = None if batch is None else batch.to_pylist()
            except Exception as e:  # noqa: BLE001 - a corrupt page: pyarrow's OSError/ArrowInvalid
                error = " ".join(str(e).split())
                yield group, row_in_group, f"Parquet row group {group} unreadable after row {index}: {error}"
                return
            if rows is None:
                break
            for row in rows:
                yield group, row_in_group, row
                row_in_group += 1
                index += 1
