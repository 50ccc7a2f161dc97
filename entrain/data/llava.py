"""Streaming readers for LLaVA-format datasets and their per-sample metadata.

Formats (``docs/datasets.md``):

- LLaVA JSON: one array of records ``{"id", "image": path | [paths] (or "images": [paths]),
  "conversations": [{"from": "human"|"gpt"|"system", "value": "<image>\\n..."}, ...]}``; one
  ``<image>`` placeholder per image; records without images are text-only samples.
- LLaVA JSONL: the same records, one per line (also accepted in a ``.json`` file whose first
  character is ``{``). OpenAI-style ``"messages": [{"role", "content"}]`` is read like
  ``conversations``; ``content`` may be a string or chat-template parts
  (``[{"type": "image"}, {"type": "text", "text": ...}]``, each image part a placeholder).
- FineVision-style or LLaVA-fields Parquet: see ``entrain.data.parquet``.
- Sharded datasets (a folder of Parquet or WebDataset ``.tar`` shards, or a Hugging Face
  ``save_to_disk`` folder) and single ``.tar`` / ``.arrow`` shards: see ``entrain.data.shards``.

Relative image paths resolve against ``image_root`` when given, else the data file's folder.
Arrays are parsed incrementally (``json.JSONDecoder.raw_decode`` over chunks), so a multi-GB file
is never loaded whole. Every reader yields ``Parsed`` items: the normalised ``Record`` (roles
``system``/``user``/``assistant``) or the problems that made it unusable, each naming a field.

``read_metadata`` turns a dataset into ``SampleMeta`` (image sizes from the image headers, no
decode; text tokens of the Qwen2 chat-formatted conversation) and caches the result on disk
(``entrain.data.metadata_cache``) keyed by the file's path, size and mtime and each image file's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entrain.core.errors import DataError
from entrain.core.files import file_problem
from entrain.core.workload.samples import DEFAULT_VISION, SampleMeta, VisionTokenConfig
from entrain.data.conversation import parse_record
from entrain.data.problems import image_error, open_image, oriented_size, unread
from entrain.data.records import IMAGE_PLACEHOLDER, ROLES, Parsed, Record

__all__ = [
    "IMAGE_PLACEHOLDER",
    "ROLES",
    "Parsed",
    "Record",
    "data_format",
    "file_metadata",
    "image_size",
    "is_conversation_file",
    "iter_parsed",
    "iter_records",
    "parse_record",
    "read_metadata",
    "record_meta",
]

_CHUNK_CHARS = 1 << 20
_MAX_RECORD_CHARS = 1 << 28


# --- raw JSON / JSONL streaming -------------------------------------------------------------------


@dataclass(slots=True)
class _Raw:
    index: int
    line: int | None
    obj: Any = None
    error: str | None = None
    fatal: bool = False


def _iter_jsonl(path: Path) -> Iterator[_Raw]:
    index = 0
    with open(path, encoding="utf-8", errors="strict") as f:
        line_no = 0
        while True:
            try:
                text = f.readline()
            except UnicodeDecodeError as e:
                yield _Raw(
                    index, line_no + 1, error=f"not UTF-8 text after line {line_no}: {e.reason}", fatal=True
                )
                return
            if not text:
                return
            line_no += 1
            if not text.strip():
                continue
            try:
                yield _Raw(index, line_no, obj=json.loads(text))
            except json.JSONDecodeError as e:
                error = f"invalid JSON at line {line_no}, column {e.colno}: {e.msg}"
                if not text.endswith("\n") and e.pos >= len(text.rstrip()):  # the last line, cut short
                    yield _Raw(index, line_no, error=f"{error}: the file ends inside a record", fatal=True)
                    return
                yield _Raw(index, line_no, error=error)
            index += 1


class _ArrayStream:
    """Incremental reader of a top-level JSON array: yields its elements one by one."""

    def __init__(self, f, chunk_chars: int, max_record_chars: int):
        self.f, self.chunk, self.max_record = f, chunk_chars, max_record_chars
        self.buf, self.pos, self.line, self.eof = "", 0, 1, False
        self.decoder = json.JSONDecoder()

    def _fill(self) -> bool:
        if self.eof:
            return False
        data = self.f.read(self.chunk)
        if not data:
            self.eof = True
            return False
        self.buf = self.buf[self.pos :] + data
        self.pos = 0
        return True

    def _advance(self, end: int) -> None:
        self.line += self.buf.count("\n", self.pos, end)
        self.pos = end

    def _peek(self) -> str:
        """The next non-whitespace character ('' at end of file), consuming the whitespace."""
        while True:
            n = len(self.buf)
            i = self.pos
            while i < n and self.buf[i] in " \t\r\n":
                i += 1
            self._advance(i)
            if i < n:
                return self.buf[i]
            if not self._fill():
                return ""

    def _error(self, pos: int, msg: str) -> str:
        line = self.line + self.buf.count("\n", self.pos, pos)
        col = pos - (self.buf.rfind("\n", 0, pos) + 1) + 1
        return f"invalid JSON at line {line}, column {col}: {msg}"

    def _decode(self) -> tuple[Any, int]:
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof:
                    return obj, end
            except json.JSONDecodeError as e:
                if self.eof or len(self.buf) - self.pos > self.max_record:
                    raise ValueError(self._error(e.pos, e.msg)) from None
            self._fill()

    def __iter__(self) -> Iterator[_Raw]:
        index = 0
        if self._peek() != "[":
            yield _Raw(0, self.line, error=self._error(self.pos, "expected '[' (a JSON array)"), fatal=True)
            return
        self._advance(self.pos + 1)
        if self._peek() == "]":
            return
        while True:
            if not self._peek():
                yield _Raw(
                    index, self.line, error=self._error(self.pos, "unexpected end of file"), fatal=True
                )
                return
            line = self.line
            try:
                obj, end = self._decode()
            except ValueError as e:
                yield _Raw(index, line, error=str(e), fatal=True)
                return
            self._advance(end)
            yield _Raw(index, line, obj=obj)
            index += 1
            c = self._peek()
            if c == ",":
                self._advance(self.pos + 1)
                continue
            if c == "]":
                self._advance(self.pos + 1)
                if self._peek():
                    yield _Raw(
                        index,
                        self.line,
                        error=self._error(self.pos, "extra data after the array"),
                        fatal=True,
                    )
                return
            msg = "unexpected end of file" if not c else "expected ',' or ']'"
            yield _Raw(index, self.line, error=self._error(self.pos, msg), fatal=True)
            return


def _iter_json_array(path: Path, chunk_chars: int = _CHUNK_CHARS) -> Iterator[_Raw]:
    with open(path, encoding="utf-8") as f:
        try:
            yield from _ArrayStream(f, chunk_chars, _MAX_RECORD_CHARS)
        except UnicodeDecodeError as e:
            yield _Raw(0, None, error=f"not UTF-8 text: {e.reason}", fatal=True)


PARQUET_MAGIC = b"PAR1"


SHARD_SUFFIXES = {".tar": "webdataset", ".arrow": "arrow"}


def data_format(path: str | Path) -> str:
    """``"json"`` (array), ``"jsonl"``, ``"parquet"``, ``"webdataset"`` (a ``.tar`` shard) or
    ``"arrow"`` (a ``save_to_disk`` arrow file), from the suffix, the Parquet magic bytes and the
    first character."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        return "parquet"
    if suffix in SHARD_SUFFIXES:
        return SHARD_SUFFIXES[suffix]
    with open(p, "rb") as f:
        raw = f.read(4096)
    if raw.startswith(PARQUET_MAGIC):
        return "parquet"
    if suffix == ".jsonl":
        return "jsonl"
    head = raw.lstrip(b"\xef\xbb\xbf \t\r\n")
    return "jsonl" if head.startswith(b"{") else "json"


def is_conversation_file(path: str | Path) -> bool:
    """True for a sharded dataset folder, a Parquet / tar / arrow file, or a JSON/JSONL file whose
    first record has ``conversations`` or ``messages`` (a LLaVA/ShareGPT dataset, not a workload
    JSONL of sizes and token counts)."""
    p = Path(path)
    if p.is_dir():
        from entrain.data.shards import is_sharded_dataset

        return is_sharded_dataset(p)
    if file_problem(p) is not None:
        return False
    fmt = data_format(p)
    if fmt in ("parquet", "webdataset", "arrow"):
        return True
    raws = _iter_jsonl(p) if fmt == "jsonl" else _iter_json_array(p)
    first = next(iter(raws), None)
    return (
        first is not None
        and isinstance(first.obj, dict)
        and ("conversations" in first.obj or "messages" in first.obj)
    )


def iter_parsed(path: str | Path, image_root: str | Path | None = None) -> Iterator[Parsed]:
    """Every record of a LLaVA JSON/JSONL or Parquet file, a shard or a sharded dataset folder
    (shard after shard), parsed, in file order."""
    p = Path(path)
    if p.is_dir():
        from entrain.data.shards import iter_sharded

        yield from iter_sharded(p, image_root)
        return
    problem = file_problem(p)
    if problem is not None:
        raise DataError(str(p), None, None, problem)
    fmt = data_format(p)
    if fmt in ("parquet", "webdataset", "arrow"):
        from entrain.data.shards import iter_shard

        yield from iter_shard(p, fmt, image_root)
        return
    base = Path(image_root) if image_root is not None else p.parent
    raws = _iter_jsonl(p) if fmt == "jsonl" else _iter_json_array(p)
    for raw in raws:
        if raw.error is not None:
            error = f"{raw.error}; {unread(raw.index)}" if raw.fatal else raw.error
            yield Parsed(str(p), raw.index, raw.line, None, None, [("json", error)], raw.fatal)
        else:
            yield parse_record(
                raw.obj, file=str(p), index=raw.index, line=raw.line, base=base, audio_files=True
            )


def _raise(item: Parsed) -> None:
    fld, reason = item.problems[0]
    record = item.line if item.line is not None else f"#{item.index}"
    if item.id is not None:
        record = f"{record} (id {item.id})"
    hint = (
        "; run `entrain data check` for every problem" if len(item.problems) == 1 and not item.fatal else ""
    )
    raise DataError(item.file, record, fld, f"{reason}{hint}")


def iter_records(path: str | Path, image_root: str | Path | None = None) -> Iterator[Record]:
    """The file's records; raises DataError (file, record, field) at the first unusable one."""
    for item in iter_parsed(path, image_root):
        if item.record is None:
            _raise(item)
        yield item.record


# --- metadata ---------------------------------------------------------------------------------------


def image_size(src: str | bytes) -> tuple[int, int]:
    """``(H, W)`` of an image file or encoded bytes, from its header (no pixel decode), after its EXIF
    orientation (a quarter turn swaps them), as ``processing.load_image`` turns it."""
    with open_image(src) as im:
        return oriented_size(im)


def record_meta(
    record: Record, tokenizer, vision: VisionTokenConfig = DEFAULT_VISION, sizes=None, stamps=None
) -> SampleMeta:
    """``SampleMeta`` of ``record``: header image sizes and chat-formatted text tokens.

    ``sizes`` is an optional dict cache ``path -> (H, W)`` (datasets reuse images); ``stamps`` an
    optional dict that receives each image file's ``[size_bytes, mtime_ns]`` (the metadata cache's
    check). Raises DataError naming the record and image for an unreadable image.
    """
    from entrain.data.metadata_cache import file_stamp
    from entrain.data.processing import count_tokens

    dims = []
    for i, src in enumerate(record.images):
        key = src if isinstance(src, str) else None
        hw = sizes.get(key) if sizes is not None and key is not None else None
        if hw is None:
            if stamps is not None and key is not None:
                stamps[key] = file_stamp(key)
            try:
                hw = image_size(src)
            except (OSError, ValueError, SyntaxError) as e:
                fld = f"images[{i}]"
                raise DataError(
                    record.file, record.line or f"#{record.index}", fld, f"{_short(src)}: {image_error(e)}"
                ) from None
            if sizes is not None and key is not None:
                sizes[key] = hw
        _check_resizable(record, i, src, hw, vision)
        dims.append(hw)
    clips = record_audio_frames(record, stamps)
    if not record.video:
        text, answer = count_tokens(record.turns, tokenizer)
        return SampleMeta(record.id, tuple(dims), text, vision, answer, audio=clips)
    from entrain.data.video_records import counted_turns, record_videos

    videos, audio = record_videos(record, clips, stamps)
    text, answer = count_tokens(counted_turns(record, tokenizer), tokenizer)
    return SampleMeta(record.id, tuple(dims), text, vision, answer, audio=audio, video=videos)


def record_audio_frames(record: Record, stamps=None) -> tuple[int, ...]:
    """Mel frames of each audio clip of ``record``, in order (``entrain.data.audio``: read, resampled
    to 16 kHz, at most 30 s); ``stamps`` receives each file's stamp as ``record_meta``'s. Raises
    DataError naming the record, field and file of a bad clip."""
    from entrain.data.audio import AudioFileError, load_clip, mel_frames
    from entrain.data.metadata_cache import file_stamp

    frames = []
    for i, path in enumerate(record.audio):
        if stamps is not None and isinstance(path, str):  # a clip inside a shard: the shard's stamp
            stamps[path] = file_stamp(path)
        try:
            frames.append(mel_frames(len(load_clip(path))))
        except AudioFileError as e:
            fld = f"{record.audio_field}[{i}]"
            raise DataError(
                record.file, record.line or f"#{record.index}", fld, f"{path}: {e.reason}"
            ) from None
    return tuple(frames)


def _check_resizable(record: Record, i: int, src: str | bytes, hw: tuple[int, int], vision) -> None:
    """Raise DataError naming the record and image when Qwen's ``smart_resize`` refuses its size (an
    aspect ratio above ``vision.max_aspect_ratio``; a rule without one takes any), in ``entrain data
    check``'s words."""
    height, width = hw
    ratio = max(height, width) / max(1, min(height, width))
    if ratio > getattr(vision, "max_aspect_ratio", math.inf):  # a tiling family's rule has no limit
        raise DataError(
            record.file,
            record.line or f"#{record.index}",
            f"images[{i}]",
            f"record id {record.id!r}: {_short(src)}: aspect ratio {ratio:.1f} of a {width}x{height} image "
            f"> {vision.max_aspect_ratio:g} (the most Qwen's image processor takes)",
        )


def _short(src) -> str:
    """A path as itself, an image in a shard as ``shard#location``, bytes as their length."""
    return src if isinstance(src, str) else f"<{len(src)} bytes>" if isinstance(src, bytes) else str(src)


def read_metadata(
    path: str | Path,
    image_root: str | Path | None = None,
    tokenizer=None,
    vision: VisionTokenConfig = DEFAULT_VISION,
    *,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    workers: int | None = None,
) -> list[SampleMeta]:
    """Per-sample metadata of a LLaVA JSON/JSONL or Parquet dataset, a shard or a sharded dataset
    folder, in file (shard) order.

    Streams the file (memory ~ the metadata list) and reads only image headers. With ``use_cache``
    the result is stored next to the data (``.entrain_cache/``) or in ``cache_dir`` and reused while
    the file's path, size and mtime, every image file's size and mtime, the image root, tokenizer
    and vision limits are unchanged. A folder's shards are scanned in up to ``workers`` processes
    (default: one per CPU) and cached one by one (``entrain.data.shards.read_sharded_metadata``).
    ``tokenizer`` defaults to the offline Qwen2 tokenizer. Raises DataError at the first bad record
    (run ``entrain data check`` to list them all).
    """
    from entrain.data.tokenizer import default_tokenizer

    tok = tokenizer if tokenizer is not None else default_tokenizer()
    if Path(path).is_dir():
        from entrain.data.shards import read_sharded_metadata

        return read_sharded_metadata(
            path, image_root, tok, vision, file_metadata, cache_dir, use_cache, workers
        )
    return file_metadata(path, image_root, tok, vision, cache_dir, use_cache, progress=True)


def file_metadata(
    path, image_root, tok, vision, cache_dir=None, use_cache: bool = True, *, progress: bool = False
) -> list[SampleMeta]:
    """``read_metadata`` of one file (no folder) with the tokenizer ``tok``; ``progress``: count its
    records on a progress bar (``entrain.data.shards.progress_bar``)."""
    from entrain.data import metadata_cache

    key = metadata_cache.cache_key(path, image_root, tok.name, vision) if use_cache else None
    if key is not None:
        cached = metadata_cache.load(path, key, vision, cache_dir)
        if cached is not None:
            return cached
    sizes: dict[str, tuple[int, int]] = {}
    stamps: dict[str, list[int] | None] = {}
    records = iter_records(path, image_root)
    if progress:
        from entrain.data.shards import with_progress

        records = with_progress(records, f"metadata of {Path(path).name}")
    samples = [record_meta(rec, tok, vision, sizes, stamps) for rec in records]
    if key is not None:
        metadata_cache.store(path, key, samples, cache_dir, stamps)
    return samples
