"""LLaVA record normalisation: one JSON object (or a shard's row with LLaVA fields) into a ``Record``
with roles ``system``/``user``/``assistant``, or the problems that make it unusable, each naming a
field. Shared by the JSON/JSONL reader (``entrain.data.llava``) and the shard readers
(``entrain.data.parquet``, ``entrain.data.webdataset``, ``entrain.data.shards``), which import it
without importing one another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from entrain.data.problems import ASSISTANT_IMAGE
from entrain.data.records import (
    IMAGE_PLACEHOLDER,
    MEDIA_FIELDS,
    PLACEHOLDERS,
    ROLES,
    TRAINED_MEDIA,
    ImageRef,
    Parsed,
    Record,
    media_kind,
)

__all__ = ["media_problems", "parse_record"]

READ_FIELDS = frozenset(
    {"id", "conversations", "messages", *(k for keys in MEDIA_FIELDS.values() for k in keys)}
)
"""The top-level fields of a LLaVA record that the readers read."""


def _resolve(path: str, base: Path) -> str:
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else base / p)


def _image_list(obj: dict, base: Path, problems: list[tuple[str, str]]) -> list[str | ImageRef]:
    key = "images" if "images" in obj else "image" if "image" in obj else None
    if key is None or obj[key] is None:
        return []
    value = obj[key]
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        problems.append((key, f"must be a path or a list of paths, got {type(value).__name__}"))
        return []
    out: list[str | ImageRef] = []
    for i, item in enumerate(items):
        fld = key if isinstance(value, str) else f"{key}[{i}]"
        if isinstance(item, ImageRef):  # found inside a shard by its reader
            out.append(item)
        elif not isinstance(item, str):
            problems.append((fld, f"must be a path string, got {type(item).__name__}"))
        elif not item.strip():
            problems.append((fld, "empty image path"))
        else:
            out.append(_resolve(item, base))
    return out


def _turn_list(obj: dict, problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    key, role_key, text_key = "conversations", "from", "value"
    if "conversations" not in obj and "messages" in obj:
        key, role_key, text_key = "messages", "role", "content"
    conv = obj.get(key)
    if conv is None:
        problems.append(("conversations", "missing"))
        return []
    if not isinstance(conv, list) or not conv:
        problems.append((key, "must be a non-empty list of turns"))
        return []
    turns: list[tuple[str, str]] = []
    for i, turn in enumerate(conv):
        where = f"{key}[{i}]"
        if not isinstance(turn, dict):
            problems.append((where, f"must be an object, got {type(turn).__name__}"))
            continue
        speaker, text = turn.get(role_key), turn.get(text_key)
        if isinstance(text, list):  # chat-template content parts: [{"type": "image"}, {"type": "text", ...}]
            text = _content_parts(text, f"{where}.{text_key}", problems)
        if speaker is None:
            problems.append((f"{where}.{role_key}", "missing"))
        elif not isinstance(speaker, str) or speaker.lower() not in ROLES:
            problems.append(
                (f"{where}.{role_key}", f"unknown role {speaker!r} (expected one of {', '.join(ROLES)})")
            )
        if text is None:
            problems.append((f"{where}.{text_key}", "missing"))
        elif not isinstance(text, str):
            problems.append((f"{where}.{text_key}", f"must be a string, got {type(text).__name__}"))
        elif not text.strip():
            problems.append((f"{where}.{text_key}", "empty"))
        if isinstance(speaker, str) and speaker.lower() in ROLES and isinstance(text, str) and text.strip():
            role = ROLES[speaker.lower()]
            if role == "assistant" and IMAGE_PLACEHOLDER in text:
                problems.append((f"{where}.{text_key}", ASSISTANT_IMAGE))
            turns.append((role, text))
    if turns and not problems and not any(role == "assistant" for role, _ in turns):
        problems.append((key, "no assistant turn (nothing to train on)"))
    return turns


def _content_parts(parts: list, where: str, problems: list[tuple[str, str]]) -> str | None:
    out = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if (
            isinstance(kind, str) and kind in PLACEHOLDERS
        ):  # an input part: its placeholder (matched against the record's fields)
            out.append(PLACEHOLDERS[kind])
        elif kind == "text" and isinstance(part.get("text"), str):
            out.append(part["text"])
        else:
            problems.append(
                (f"{where}[{j}]", "content part must be {'type': 'image'} or {'type': 'text', 'text': ...}")
            )
            return None
    return "".join(out)


def _record_id(obj: dict, problems: list[tuple[str, str]]) -> str | None:
    rid = obj.get("id")
    if rid is None:
        problems.append(("id", "missing"))
        return None
    if isinstance(rid, bool) or not isinstance(rid, str | int):
        problems.append(("id", f"must be a string or an integer, got {type(rid).__name__}"))
        return None
    if isinstance(rid, str) and not rid.strip():
        problems.append(("id", "empty"))
        return None
    return str(rid)


def _items(value: Any) -> int:
    """How many inputs a media field's value holds (a list's length, else one; none for null or [])."""
    if value is None:
        return 0
    return len(value) if isinstance(value, list) else 1


def _media_path(value: Any) -> tuple[str, str] | None:
    """``(path, kind)`` of the first string in ``value`` (a string or a list) that names a media file."""
    for item in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
        if (
            isinstance(item, str)
            and "." in item
            and "\n" not in item
            and len(item) < 4096
            and media_kind(item.strip())
        ):
            return item, media_kind(item.strip()) or ""
    return None


def _refused(kind: str) -> str:
    """Why a FineVision-style row's ``kind`` input (video, audio) makes its record bad."""
    return (
        f"{kind} inputs are not supported in a FineVision-style table (images / texts columns, no "
        f"placeholders): entrain reads {kind} in LLaVA fields (a JSON/JSONL record, or a shard with a "
        f"conversations or messages column, or WebDataset members); the record is refused, never trained "
        f"without its {kind}"
    )


_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"fLaC", "audio"),
    (b"OggS", "audio"),
    (b"ID3", "audio"),
    (b"\xff\xfb", "audio"),
    (b"\x1a\x45\xdf\xa3", "video"),
    (b"\xff\xd8\xff", "image"),
    (b"\x89PNG", "image"),
    (b"GIF8", "image"),
)
"""``(leading bytes, kind)`` of the media files a field's bytes are recognised as (FLAC, Ogg, MP3;
WebM / Matroska; JPEG, PNG, GIF); RIFF (WAV / AVI / WebP) and ISO media (MP4 / MOV / M4A) by their
type."""


def _sniff(data: bytes) -> str | None:
    """The input kind (``audio``, ``video``, ``image``) a file's leading bytes name, else None."""
    head = bytes(data[:16])
    if head[:4] == b"RIFF":
        return {b"WAVE": "audio", b"AVI ": "video", b"WEBP": "image"}.get(head[8:12])
    if head[4:8] == b"ftyp":
        return "audio" if head[8:11] in (b"M4A", b"M4B") else "video"
    return next((kind for magic, kind in _MAGIC if head.startswith(magic)), None)


def _media_file(value: Any) -> tuple[str, str] | None:
    """``(kind, "bytes" or "path")`` of the first media file ``value`` holds as bytes or as the
    ``datasets`` Image / Audio / Video storage ``{bytes, path}`` (or a list of those): by the bytes, else
    by the path's extension."""
    for item in value if isinstance(value, list) else [value]:
        data = item.get("bytes") if isinstance(item, dict) else item
        path = item.get("path") if isinstance(item, dict) else None
        if isinstance(data, (bytes, bytearray)) and data and (kind := _sniff(data)):
            return kind, "bytes"
        if isinstance(path, str) and "." in path and (kind := media_kind(path.strip())):
            return kind, "path"
    return None


def media_problems(
    obj: dict,
    turns: list[tuple[str, str]],
    turns_field: str,
    base: Path | None = None,
    audio_files: bool = False,
) -> list[tuple[str, str]]:
    """The problems of a record's inputs other than images: video or audio without ``audio_files`` (a
    FineVision-style row) makes the record bad in one line per field (``_refused``), never trained with
    the input dropped (with ``audio_files``, a LLaVA record's audio and video files are kept, paths or
    ``ImageRef`` to files inside a shard: ``Record.audio`` / ``Record.video``, refused at training by a
    model family that reads neither); a placeholder of a kind without its
    field, or the field without its placeholder, too; and a field no reader reads holding a media
    file's path or bytes (a misspelt or unknown key would otherwise train the record without it). With
    ``base`` (the folder relative paths resolve against), every bad audio or video file is named too
    (``entrain.data.audio.check_record_audio``: missing, empty, truncated, unreadable;
    ``entrain.data.video_records.check_record_video``)."""
    problems: list[tuple[str, str]] = []
    for kind, keys in MEDIA_FIELDS.items():
        if kind in TRAINED_MEDIA:
            continue  # images: parse_record's own checks
        held = {k: _items(obj.get(k)) for k in keys if _items(obj.get(k))}
        kept = kind in ("audio", "video") and audio_files  # media files: Record.audio / Record.video
        if held and not kept:  # a FineVision row: one line, the record refused (its files not looked for)
            problems += [(key, _refused(kind)) for key in held]
            continue
        if kind == "audio" and held and base is not None:
            from entrain.data.audio import check_record_audio

            problems += check_record_audio(obj, base, placeholders=False)
        if kind == "video" and held and base is not None:
            from entrain.data.video_records import check_record_video

            problems += check_record_video(obj, base)
        placeholders = sum(text.count(PLACEHOLDERS[kind]) for _, text in turns)
        if placeholders != sum(held.values()):
            problems.append(
                (
                    turns_field,
                    f"{placeholders} {PLACEHOLDERS[kind]} placeholder(s) but "
                    f"{sum(held.values())} {kind} input(s) ({'/'.join(keys)})",
                )  # fmt: skip
            )
    for key, value in obj.items():
        found = None if key in READ_FIELDS else _media_path(value)
        stored = None if key in READ_FIELDS or found is not None else _media_file(value)
        if stored is not None:
            problems.append(
                (
                    str(key),
                    f"holds {'an' if stored[0][0] in 'aeiou' else 'a'} {stored[0]} file (its {stored[1]}) but "
                    f"{key!r} is not a field entrain reads "
                    f"(inputs go in {', '.join(k for keys in MEDIA_FIELDS.values() for k in keys)})",
                )  # fmt: skip
            )
        if found is not None:
            problems.append(
                (
                    str(key),
                    f"{found[0]!r} looks like {'an' if found[1][0] in 'aeiou' else 'a'} {found[1]} file but {key!r} is not a field entrain reads "
                    f"(inputs go in {', '.join(k for keys in MEDIA_FIELDS.values() for k in keys)})",
                )  # fmt: skip
            )
    return problems


def _files(value: Any, base: Path) -> tuple[str | ImageRef, ...]:
    """A media field's files: its paths resolved against ``base``, a shard's files (``ImageRef``) as they
    are."""
    items = [value] if isinstance(value, (str, ImageRef)) else value if isinstance(value, list) else []
    return tuple(
        p if isinstance(p, ImageRef) else _resolve(p, base)
        for p in items
        if isinstance(p, ImageRef) or (isinstance(p, str) and p.strip())
    )


def _audio_list(obj: dict, base: Path) -> tuple[tuple[str | ImageRef, ...], str]:
    """The record's audio clips (``_files``), and the field holding them (its shape
    is checked by ``media_problems``)."""
    key = "audio" if "audio" in obj else "audios"
    return _files(obj.get(key), base), key


def _video_list(obj: dict, base: Path) -> tuple[tuple[str | ImageRef, ...], str, bool]:
    """The record's videos (``_files``), the field holding them and its
    ``use_audio_in_video`` flag (shapes checked by ``media_problems``)."""
    from entrain.data.video import AUDIO_IN_VIDEO_FIELD

    key = "video" if "video" in obj else "videos"
    return _files(obj.get(key), base), key, obj.get(AUDIO_IN_VIDEO_FIELD) is True


def parse_record(
    obj: Any, *, file: str, index: int, line: int | None, base: Path, audio_files: bool = False
) -> Parsed:
    """Normalise one LLaVA record; relative image (and, with ``audio_files``, audio and video) paths
    resolve against ``base``."""
    if not isinstance(obj, dict):
        return Parsed(
            file, index, line, None, None, [("record", f"must be an object, got {type(obj).__name__}")]
        )
    problems: list[tuple[str, str]] = []
    rid = _record_id(obj, problems)
    images = _image_list(obj, base, problems)
    turns = _turn_list(obj, problems)
    placeholders = sum(text.count(IMAGE_PLACEHOLDER) for _, text in turns)
    if not problems and placeholders != len(images):
        problems.append(
            ("conversations", f"{placeholders} {IMAGE_PLACEHOLDER} placeholder(s) but {len(images)} image(s)")
        )
    turns_field = "messages" if "conversations" not in obj and "messages" in obj else "conversations"
    problems += media_problems(obj, turns, turns_field, base, audio_files)
    audio, audio_field = _audio_list(obj, base) if audio_files else ((), "audio")
    video, video_field, in_video = _video_list(obj, base) if audio_files else ((), "video", False)
    record = (
        None
        if problems
        else Record(
            rid or "",
            tuple(images),
            tuple(turns),
            file,
            index,
            line,
            audio,
            audio_field,
            video,
            video_field,
            in_video and bool(video),
        )  # fmt: skip
    )
    return Parsed(file, index, line, rid, record, problems)
