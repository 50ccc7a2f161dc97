"""The normalised conversation record every reader yields (LLaVA JSON/JSONL, Parquet, shards) and
the types the image and text processing read; no reader code, so the readers and the processing
import it without importing each other. ``ImageRef`` names a file (an image, an audio clip, a video)
stored inside a shard and reads its bytes by location only when they are needed (``read_bytes``);
``media_file`` gives a decoder what it opens of either a path or such a file."""

from __future__ import annotations

import functools
import io
import os
from dataclasses import dataclass, field, replace

__all__ = [
    "IMAGE_PLACEHOLDER",
    "MEDIA_EXTENSIONS",
    "MEDIA_FIELDS",
    "PLACEHOLDERS",
    "ROLES",
    "TRAINED_MEDIA",
    "ImageRef",
    "Parsed",
    "Record",
    "media_file",
    "media_kind",
]

IMAGE_PLACEHOLDER = "<image>"
MEDIA_FIELDS: dict[str, tuple[str, ...]] = {
    "image": ("image", "images"),
    "video": ("video", "videos"),
    "audio": ("audio", "audios"),
}
"""Every input kind a record can carry (LLaVA JSON/JSONL, Parquet / Arrow columns, WebDataset members)
and the fields that hold it."""
PLACEHOLDERS: dict[str, str] = {kind: f"<{kind}>" for kind in MEDIA_FIELDS}
"""The placeholder each input kind has in a conversation's text (one per item)."""
TRAINED_MEDIA = ("image",)
"""The input kinds every model family trains: a record carrying another kind is a bad record, never
trained with it dropped; audio (``Record.audio``) trains where the model family reads audio
(``ModelFamily.accepts_audio``), video (``Record.video``) where it reads video
(``ModelFamily.accepts_video``), and each is refused, naming the record, otherwise."""
MEDIA_EXTENSIONS: dict[str, frozenset[str]] = {
    "image": frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"}),
    "video": frozenset({"mp4", "webm", "avi", "mov", "mkv", "m4v", "flv", "wmv", "mpg", "mpeg"}),
    "audio": frozenset({"wav", "mp3", "flac", "ogg", "m4a", "aac", "opus"}),
}
"""File extensions of each input kind (WebDataset members; a path in a field no reader uses)."""


def media_kind(name: str) -> str | None:
    """The input kind a file name's extension (or a bare extension) names (``"clip.MP4"``, ``"mp4"`` ->
    ``"video"``); None for others."""
    ext = name.rsplit(".", 1)[-1].lower()
    return next((kind for kind, exts in MEDIA_EXTENSIONS.items() if ext in exts), None)


ROLES: dict[str, str] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}
"""Accepted speaker names and the chat role each maps to."""


@dataclass(frozen=True, slots=True)
class ImageRef:
    """A file inside a dataset shard (an image, or an audio clip or video of a record), read by
    location (never the whole shard).

    ``kind``: ``"tar"`` (``loc`` = (data offset, size) in bytes of the tar member), ``"parquet"``
    (``loc`` = (row group, row in the group, item)) or ``"arrow"`` (``loc`` = (row, item) of a
    Hugging Face ``save_to_disk`` arrow file); ``column`` names the column (Parquet/arrow).
    ``data`` holds the bytes while the reader that found them still has them (not compared, and
    dropped by ``light`` before a record is kept). ``name``: the file's own name where the shard
    gives one (a tar member's, the ``path`` beside the bytes of the ``datasets`` storage), for
    messages."""

    kind: str
    shard: str
    loc: tuple[int, ...]
    column: str = ""
    data: bytes | None = field(default=None, compare=False, repr=False)
    name: str = ""

    def light(self) -> ImageRef:
        return self if self.data is None else replace(self, data=None)

    def read_bytes(self) -> bytes:
        """The encoded file; OSError when the shard cannot give it."""
        if self.data is not None:
            return self.data
        if self.kind == "tar":
            offset_bytes, size_bytes = self.loc
            with open(self.shard, "rb") as f:
                f.seek(offset_bytes)
                data = f.read(size_bytes)
            if len(data) != size_bytes:
                raise OSError(f"{self}: the tar shard ends inside the file")
            return data
        try:
            value = _table_cell(self)
        except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid/OSError/IndexError
            raise OSError(f"{self}: {' '.join(str(e).split())}") from None
        data = value.get("bytes") if isinstance(value, dict) else value
        if not isinstance(data, bytes):
            raise OSError(f"{self}: no file bytes at this location")
        return data

    def __str__(self) -> str:
        name = f"{self.name}, " if self.name else ""
        if self.kind == "tar":
            return f"{self.shard} ({name}bytes {self.loc[0]}..{self.loc[0] + self.loc[1]})"
        *rows, item = self.loc
        where = f"row group {rows[0]}, row {rows[1]}" if self.kind == "parquet" else f"row {rows[0]}"
        return f"{self.shard} ({name}{where}, {self.column}[{item}])"


def media_file(src: str | os.PathLike | ImageRef) -> str | io.BytesIO:
    """What a decoder opens for ``src``: a file's path as a string, or the bytes of a file inside a
    shard as a file object (OSError when the shard cannot give them)."""
    return io.BytesIO(src.read_bytes()) if isinstance(src, ImageRef) else os.fspath(src)


@functools.lru_cache(maxsize=4)
def _parquet_group(shard: str, group: int, column: str):
    import pyarrow.parquet as pq

    return pq.ParquetFile(shard).read_row_group(group, columns=[column]).column(0)


@functools.lru_cache(maxsize=8)
def _arrow_column(shard: str, column: str):
    import pyarrow as pa

    source = pa.memory_map(shard)  # zero-copy: the table's buffers stay on the mapped file
    return pa.ipc.open_stream(source).read_all().column(column)


def _table_cell(ref: ImageRef):
    if ref.kind == "parquet":
        group, row, item = ref.loc
        cell = _parquet_group(ref.shard, group, ref.column)[row].as_py()
    elif ref.kind == "arrow":
        row, item = ref.loc
        cell = _arrow_column(ref.shard, ref.column)[row].as_py()
    else:
        raise ValueError(f"unknown image location kind {ref.kind!r}")
    return cell[item] if isinstance(cell, list) else cell


@dataclass(frozen=True, slots=True)
class Record:
    """One normalised sample.

    ``images`` holds resolved file paths (``str``), encoded image bytes (a Parquet file) or
    ``ImageRef`` (an image inside a shard, read when needed);
    ``turns`` holds ``(role, text)`` with role in ``system``/``user``/``assistant`` and ``<image>``
    placeholders left in the text. ``index`` is the record's 0-based position in ``file``;
    ``line`` its 1-based line where known. ``audio`` holds its audio clips (resolved paths, or
    ``ImageRef`` to a clip inside a shard), in the order of its ``<audio>`` placeholders
    (``audio_field``: the field that held them); ``video`` its videos (paths or ``ImageRef``) in the
    order of its ``<video>`` placeholders (``video_field``), whose audio tracks it feeds too where
    ``audio_in_video`` (its ``use_audio_in_video``).
    """

    id: str
    images: tuple[str | bytes | ImageRef, ...]
    turns: tuple[tuple[str, str], ...]
    file: str = ""
    index: int = 0
    line: int | None = None
    audio: tuple[str | ImageRef, ...] = ()
    audio_field: str = "audio"
    video: tuple[str | ImageRef, ...] = ()
    video_field: str = "video"
    audio_in_video: bool = False

    @property
    def image_paths(self) -> tuple[str, ...]:
        return tuple(i for i in self.images if isinstance(i, str))

    def light(self) -> Record:
        """This record without the image, audio and video bytes its shard reader held
        (``ImageRef.light``): what is kept for training, which reads each file again by location."""
        held = (self.images, self.audio, self.video)
        if not any(isinstance(i, ImageRef) and i.data is not None for items in held for i in items):
            return self

        def light(items: tuple) -> tuple:
            return tuple(i.light() if isinstance(i, ImageRef) else i for i in items)

        return replace(self, images=light(self.images), audio=light(self.audio), video=light(self.video))

    @property
    def where(self) -> str:
        """``file:line`` (or ``file:#index``) for messages."""
        return f"{self.file}:{self.line}" if self.line is not None else f"{self.file}:#{self.index}"


@dataclass(frozen=True, slots=True)
class Parsed:
    """A reader's item: the record, or ``problems`` ``[(field, reason)]`` that make it unusable.

    ``fatal`` marks a problem after which the reader cannot continue (a JSON array's syntax error).
    """

    file: str
    index: int
    line: int | None
    id: str | None
    record: Record | None
    problems: list[tuple[str, str]] = field(default_factory=list)
    fatal: bool = False
