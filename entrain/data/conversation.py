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


def media_problems(
    obj: dict,
    turns: list[tuple[str, str]],
    turns_field: str,
    base: Path | None = None,
    audio_files: bool = False,
) -> list[tuple[str, str]]:
    """The problems of a record's inputs other than images: every input kind entrain does not train
    (video, audio in a shard) is a bad record, never trained with the input dropped (with
    ``audio_files``, a LLaVA JSON/JSONL record's audio file paths are kept: ``Record.audio``, refused
    at training by a model family that reads no audio); a placeholder of such a kind
    without its field, or the field without its placeholder, too; and a field no reader reads holding a
    media file's path (a misspelt or unknown key would otherwise train the record without it). With
    ``base`` (the folder relative audio paths resolve against), every bad audio file is named too
    (``entrain.data.audio.check_record_audio``: missing, empty, truncated, unreadable)."""
    problems: list[tuple[str, str]] = []
    for kind, keys in MEDIA_FIELDS.items():
        if kind in TRAINED_MEDIA:
            continue  # images: parse_record's own checks
        held = {k: _items(obj.get(k)) for k in keys if _items(obj.get(k))}
        kept = kind in ("audio", "video") and audio_files  # media files: Record.audio / Record.video
        for key in held if not kept else ():
            problems.append(
                (
                    key,
                    f"{kind} inputs are not supported: no model family entrain trains reads {kind} "
                    + ("from a shard " if kind == "audio" else "")
                    + f"(it trains the {'/'.join(MEDIA_FIELDS['image'])} fields"
                    + (
                        " only; audio as file paths in a LLaVA JSON/JSONL record)"
                        if kind == "audio"
                        else " only)"
                    ),
                )  # fmt: skip
            )
        if kind == "audio" and held and base is not None:
            from entrain.data.audio import check_record_audio

            problems += check_record_audio(obj, base, placeholders=False)
        if kind == "video" and held and base is not None and audio_files:
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
        if found is not None:
            problems.append(
                (
                    str(key),
                    f"{found[0]!r} looks like {'an' if found[1][0] in 'aeiou' else 'a'} {found[1]} file but {key!r} is not a field entrain reads "
                    f"(inputs go in {', '.join(k for keys in MEDIA_FIELDS.values() for k in keys)})",
                )  # fmt: skip
            )
    return problems


def _audio_list(obj: dict, base: Path) -> tuple[tuple[str, ...], str]:
    """The record's audio clip paths, resolved against ``base``, and the field holding them (its shape
    is checked by ``media_problems``)."""
    key = "audio" if "audio" in obj else "audios"
    value = obj.get(key)
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return tuple(_resolve(p, base) for p in items if isinstance(p, str) and p.strip()), key


def _video_list(obj: dict, base: Path) -> tuple[tuple[str, ...], str, bool]:
    """The record's video paths, resolved against ``base``, the field holding them and its
    ``use_audio_in_video`` flag (shapes checked by ``media_problems``)."""
    from entrain.data.video import AUDIO_IN_VIDEO_FIELD

    key = "video" if "video" in obj else "videos"
    value = obj.get(key)
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    paths = tuple(_resolve(p, base) for p in items if isinstance(p, str) and p.strip())
    return paths, key, obj.get(AUDIO_IN_VIDEO_FIELD) is True


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
