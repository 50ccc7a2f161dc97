"""WebDataset ``.tar`` shards with LLaVA fields, streamed with the standard library's ``tarfile``.

A sample is the run of consecutive members that share a key: the member name up to the first dot
of its base name (``dir/000042.json`` and ``dir/000042.jpg`` are sample ``dir/000042``). Its
``.json`` member holds the LLaVA record (``conversations`` or ``messages``, ``id``; the key when
``id`` is absent); its image members (``.jpg``, ``.png``, ...; several as ``.0.jpg``, ``.1.png``,
in that order) are its images, in place of any ``image``/``images`` paths in the JSON; its audio members
(``.wav``, ``.flac``, ...; ``.0.wav``, ``.1.wav``) and video members (``.mp4``, ``.mov``, ...) likewise
are its ``audios`` and ``videos``, in place of the JSON's ``audio``/``audios`` and ``video``/``videos``,
one ``<audio>`` / ``<video>`` placeholder each, read and trained as a JSON record's files are. Without
members of a kind the JSON's own paths of that kind are used (relative to ``image_root`` or the shard's
folder).

The shard is read once, front to back (``r|``: no index of members is kept), and each image, clip
or video becomes an ``ImageRef`` to its bytes' offset in the tar, read again by location when training
needs it. A record is named by the shard and its 0-based sample index in it.
"""

from __future__ import annotations

import json
import posixpath
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from entrain.data.problems import unread
from entrain.data.records import MEDIA_EXTENSIONS, MEDIA_FIELDS, ImageRef, Parsed, media_kind

__all__ = ["IMAGE_EXTENSIONS", "iter_tar", "sample_key"]

IMAGE_EXTENSIONS = MEDIA_EXTENSIONS["image"]


def sample_key(name: str) -> tuple[str, str]:
    """``(key, extension)`` of a member name: ``"a/b.0.jpg"`` -> ``("a/b", "0.jpg")``."""
    folder, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    return posixpath.join(folder, stem), ext.lower() if dot else ""


def _ext_order(ext: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in ext.split("."))


@dataclass
class _Sample:
    key: str
    json_text: bytes | None = None
    images: list[tuple[str, ImageRef]] = field(default_factory=list)
    media: dict[str, list[tuple[str, ImageRef]]] = field(default_factory=dict)
    """``kind`` (``audio``, ``video``) -> its members ``(extension, ImageRef)``."""
    others: list[str] = field(default_factory=list)


def _members(shard: Path) -> Iterator[_Sample | str]:
    """The shard's samples in order; a string (why) when the tar cannot be read further."""
    current: _Sample | None = None
    try:
        with tarfile.open(shard, "r|") as tf:
            for member in tf:
                tf.members = []  # stream mode still lists every member: keep memory flat
                if not member.isfile():
                    continue
                key, ext = sample_key(member.name)
                if current is not None and key != current.key:
                    yield current
                    current = None
                current = current or _Sample(key)
                _add(current, tf, member, ext, shard)
            end_bytes = tf.offset
        if shard.stat().st_size - end_bytes < tarfile.BLOCKSIZE:  # tarfile ends quietly at a cut header
            raise tarfile.ReadError(f"no end-of-archive block after byte {end_bytes}")
    except (tarfile.TarError, EOFError, OSError) as e:
        yield f"not a readable tar shard (cut off or corrupt?): {' '.join(str(e).split()) or type(e).__name__}"
        return
    if current is not None:
        yield current


def _add(sample: _Sample, tf: tarfile.TarFile, member: tarfile.TarInfo, ext: str, shard: Path) -> None:
    last = ext.rsplit(".", 1)[-1]
    if ext == "json":
        sample.json_text = tf.extractfile(member).read()
    elif last in IMAGE_EXTENSIONS:
        data = tf.extractfile(member).read()
        ref = ImageRef("tar", str(shard), (member.offset_data, member.size), "", data)
        sample.images.append((ext, ref))
    elif (kind := media_kind(last)) is not None:
        data = tf.extractfile(member).read()
        ref = ImageRef("tar", str(shard), (member.offset_data, member.size), "", data, member.name)
        sample.media.setdefault(kind, []).append((ext, ref))
    else:
        sample.others.append(ext)


def _parse(sample: _Sample, shard: Path, index: int, base: Path) -> Parsed:
    from entrain.data.conversation import parse_record

    file = str(shard)
    if sample.json_text is None:
        held = [e for e, _ in sample.images] + [e for refs in sample.media.values() for e, _ in refs]
        members = ", ".join(f".{e}" for e in held + sample.others) or "none"
        reason = f"sample {sample.key!r} has no .json member (its members: {members})"
        return Parsed(file, index, None, sample.key, None, [("json", reason)])
    try:
        obj = json.loads(sample.json_text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return Parsed(
            file, index, None, sample.key, None, [("json", f"{sample.key}.json: invalid JSON: {e}")]
        )
    if isinstance(obj, dict):
        obj.setdefault("id", sample.key)
        for kind, members in (("image", sample.images), *sample.media.items()):
            if members:  # in place of the JSON's own paths of this kind
                single, listed = MEDIA_FIELDS[kind]
                obj.pop(single, None)
                obj[listed] = [ref for _, ref in sorted(members, key=lambda x: _ext_order(x[0]))]
    return parse_record(obj, file=file, index=index, line=None, base=base, audio_files=True)


def iter_tar(path: str | Path, image_root: str | Path | None = None) -> Iterator[Parsed]:
    """Parse every sample of a WebDataset tar shard, in order."""
    shard = Path(path)
    base = Path(image_root) if image_root is not None else shard.parent
    index = 0
    for sample in _members(shard):
        if isinstance(sample, str):
            yield Parsed(str(shard), index, None, None, None, [("tar", f"{sample}; {unread(index)}")], True)
            return
        yield _parse(sample, shard, index, base)
        index += 1
