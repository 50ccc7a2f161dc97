"""Streamed reading of a workload JSONL into a ``SampleTable`` (columns, no Python object per record).

The file is read in chunks of ``CHUNK_LINES`` lines; a chunk is decoded as one JSON array and its
fields are checked column-wise, then appended to numpy buffers (ids as UTF-8 bytes, one ``int64``
per image side and per count), so memory holds one chunk of records plus a few dozen bytes per
record whatever the file's size. A chunk that fails any check is read again line by line through
``workload_io``'s record parser, which raises its ``DataError`` naming ``file:line`` and the field
(the same messages, in the same order, as ``read_workload_jsonl``). Duplicate ids are found after
the scan from 64-bit hashes of the ids (strings compared only inside a hash collision group) and
reported at the first repeated line, as the list reader reports them.
"""

from __future__ import annotations

import json
from functools import partial
from itertools import islice

import numpy as np

from entrain.core.errors import DataError
from entrain.core.workers import ordered_map, worker_jobs
from entrain.core.workload.sample_table import NO_ANSWER, SampleTable
from entrain.core.workload.samples import DEFAULT_VISION, SampleMeta, VisionTokenConfig
from entrain.data.workload_io import parse_line, parse_workload

__all__ = ["CHUNK_LINES", "read_workload_table"]

CHUNK_LINES = 1 << 15
"""Lines decoded and checked together (bounds the Python objects alive at once)."""

PARALLEL_CHUNKS = 8
"""Chunks read at once and decoded in worker processes when ``worker_processes`` allows them."""

_FIELDS = ("id_bytes", "id_ends", "id_hashes", "image_counts", "heights", "widths", "text", "answer", "lines")


class _Columns:
    """The column buffers of a scan: one list of numpy arrays per field, one array per chunk."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {name: [] for name in _FIELDS}
        self.num_records = 0

    def add_chunk(self, path: str, numbered: list[tuple[int, str]], vision: VisionTokenConfig) -> None:
        """Append a chunk; on a bad record, append the records before it, then raise its DataError."""
        cols = _chunk_columns(numbered, vision.max_aspect_ratio)
        if cols is not None:
            return self.append(cols, len(numbered))
        metas = []  # some record is bad: find it (and its message) line by line
        try:
            for n, line in numbered:
                metas.append((n, parse_workload(path, n, parse_line(path, n, line), vision)))
                if metas[-1][1].audio or metas[-1][1].video:
                    raise _HasAudio
        finally:
            if metas:
                self.append(_columns_of(path, metas), len(metas))

    def append(self, cols: dict[str, np.ndarray], num_records: int) -> None:
        for name in _FIELDS:
            self.parts[name].append(cols[name])
        self.num_records += num_records

    def column(self, name: str) -> np.ndarray:
        parts = self.parts[name]
        return (
            np.concatenate(parts)
            if parts
            else np.zeros(0, dtype=np.uint8 if name == "id_bytes" else np.int64)
        )

    def id_offsets(self) -> np.ndarray:
        ends, lengths = [], self.parts["id_ends"]
        base = 0
        for chunk_ends in lengths:
            ends.append(chunk_ends + base)
            base += int(chunk_ends[-1]) if len(chunk_ends) else 0
        return np.concatenate([np.zeros(1, np.int64), *ends])

    def check_unique(self, path: str) -> None:
        """DataError at the first line whose id an earlier line has."""
        hashes = self.column("id_hashes")
        order = np.argsort(hashes, kind="stable")
        same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
        if not len(same):
            return
        offsets, text, lines = self.id_offsets(), self.column("id_bytes").tobytes(), self.column("lines")
        first_of: dict[bytes, int] = {}
        repeats = []
        for i in sorted(set(order[same].tolist()) | set(order[same + 1].tolist())):
            sid = text[offsets[i] : offsets[i + 1]]
            if sid in first_of:
                repeats.append(i)
            else:
                first_of[sid] = i
        if repeats:
            i = min(repeats)
            sid = text[offsets[i] : offsets[i + 1]]
            first = lines[first_of[sid]]
            raise DataError(
                path, int(lines[i]), "id", f"duplicate id {sid.decode('utf-8')!r} (first on line {first})"
            )

    def table(self, vision: VisionTokenConfig) -> SampleTable:
        image_ends = np.concatenate([np.zeros(1, np.int64), np.cumsum(self.column("image_counts"))])
        return SampleTable.build(
            self.column("id_bytes"), self.id_offsets(), image_ends, self.column("heights"), self.column("widths"),
            self.column("text"), self.column("answer"), vision,
        )  # fmt: skip


def _chunk_columns(numbered: list[tuple[int, str]], max_ratio: float) -> dict[str, np.ndarray] | None:
    """The chunk's columns when every record passes ``parse_workload``'s checks, else None."""
    try:
        records = json.loads("[" + ",".join(line for _, line in numbered) + "]")
    except json.JSONDecodeError:
        return None
    if len(records) != len(numbered) or not all(type(r) is dict for r in records):
        return None  # e.g. a line holding two values, or a non-object
    ids = [r.get("id") for r in records]
    texts = [r.get("text_tokens") for r in records]
    answers = [r.get("answer_tokens") for r in records]
    images = [r.get("images") for r in records]
    if not (all(type(x) is str and x for x in ids) and all(type(t) is int for t in texts)):
        return None
    if not all(type(x) is list for x in images) or any(r.get("audio") or r.get("video") for r in records):
        return None  # audio clips or videos: the records are read as SampleMeta (``_HasAudio``)
    flat = [size for sizes in images for size in sizes]
    if not all(type(s) is list and len(s) == 2 and type(s[0]) is int and type(s[1]) is int for s in flat):
        return None
    return _checked_arrays(numbered, records, ids, texts, answers, images, flat, max_ratio)


def _checked_arrays(numbered, records, ids, texts, answers, images, flat, max_ratio):
    """The range checks over arrays (text >= 0 and not empty, answer in 0..text, positive sides,
    aspect ratio), then the chunk's columns; None when any fails."""
    try:
        text = np.array(texts, dtype=np.int64)
        counts = np.fromiter(map(len, images), dtype=np.int64, count=len(images))
        answer = np.array([NO_ANSWER if a is None else a for a in answers], dtype=np.int64)
        sides = np.array(flat, dtype=np.int64).reshape(-1, 2)
    except (OverflowError, TypeError, ValueError):
        return None
    bad_answer = any(a is not None and type(a) is not int for a in answers)
    given = answer != NO_ANSWER
    if bad_answer or (text < 0).any() or ((text == 0) & (counts == 0)).any():
        return None
    if (given & ((answer < 0) | (answer > text))).any() or (sides <= 0).any():
        return None
    h, w = sides[:, 0], sides[:, 1]
    if (np.maximum(h, w) / np.minimum(h, w) > max_ratio).any():
        return None
    encoded = [x.encode("utf-8") for x in ids]
    return {
        "id_bytes": np.frombuffer(b"".join(encoded), dtype=np.uint8),
        "id_ends": np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))),
        "id_hashes": np.array([hash(x) for x in ids], dtype=np.int64),
        "image_counts": counts, "heights": h.copy(), "widths": w.copy(), "text": text, "answer": answer,
        "lines": np.array([n for n, _ in numbered], dtype=np.int64),
    }  # fmt: skip


def _columns_of(path: str, metas: list) -> dict[str, np.ndarray]:
    """A chunk's columns from parsed records ``(line, SampleMeta)``."""
    numbered = [(n, json.dumps({"id": m.id, "images": [list(x) for x in m.images], "text_tokens": m.text_tokens,
                               "answer_tokens": m.answer_tokens})) for n, m in metas]  # fmt: skip
    cols = _chunk_columns(numbered, float("inf"))
    if cols is None:  # the parser takes any integer; the columns hold 64-bit ones
        raise DataError(path, metas[0][0], None, "a count or image side beyond 64-bit integers in this chunk")
    return cols


def _chunks(f, size: int):
    """``(line number, line)`` of the non-blank lines, ``size`` lines at a time."""
    numbered = ((n, line) for n, line in enumerate(f, 1) if line.strip())
    while chunk := list(islice(numbered, size)):
        yield chunk


class _HasAudio(Exception):
    """A record holds audio clips or videos, which the table's columns do not carry."""


def read_workload_table(
    path: str, vision: VisionTokenConfig = DEFAULT_VISION, chunk_lines: int = CHUNK_LINES
) -> SampleTable | list[SampleMeta]:
    """The samples of a workload JSONL in file order, as a ``SampleTable``; DataError naming
    ``file:line`` and the field for a bad record, as ``workload_io.read_workload_jsonl``. Under
    ``entrain.core.workers.worker_processes`` (``plan --jobs``) ``PARALLEL_CHUNKS`` chunks at a time
    are decoded in the workers (the same columns; a chunk that fails is read again here). A file
    whose records hold audio clips or videos is read as a list of ``SampleMeta`` instead (nothing dropped)."""
    try:
        return _read_table(str(path), vision, chunk_lines)
    except _HasAudio:
        from entrain.data.workload_io import read_workload_jsonl

        return read_workload_jsonl(str(path), vision)


def _read_table(path: str, vision: VisionTokenConfig, chunk_lines: int) -> SampleTable:
    cols = _Columns()
    group = PARALLEL_CHUNKS if worker_jobs() > 1 else 1
    decode = partial(_chunk_columns, max_ratio=vision.max_aspect_ratio)
    with open(path, encoding="utf-8") as f:
        chunks = _chunks(f, chunk_lines)
        while batch := list(islice(chunks, group)):
            decoded = ordered_map(decode, batch) if group > 1 else [None] * len(batch)
            for chunk, got in zip(batch, decoded):
                if got is not None:
                    cols.append(got, len(chunk))
                else:
                    _add_chunk(cols, path, chunk, vision)
    cols.check_unique(path)
    return cols.table(vision)


def _add_chunk(cols: _Columns, path: str, chunk: list[tuple[int, str]], vision: VisionTokenConfig) -> None:
    try:
        cols.add_chunk(path, chunk, vision)
    except DataError as e:
        cols.check_unique(path)  # a repeated id on an earlier line is the first problem
        line = dict(chunk).get(e.record, "\n")
        if e.field is not None or line.endswith("\n"):
            raise
        from entrain.data.problems import unread  # the last line, cut short: a truncated file

        raise DataError(path, e.record, None, f"{e.reason}; {unread(cols.num_records)}") from None
