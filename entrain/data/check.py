"""Dataset validation: ``entrain data check`` and the trainer's ``--on-bad-sample error|skip``.

Every record of a LLaVA JSON/JSONL or Parquet file, or of a sharded dataset folder (its shards
checked in parallel processes, ``entrain.data.shards``) is parsed, its images decoded fully
and run through the model family's image processor (``processor``: passed in by the caller), and its
chat-formatted length measured. Findings:

- severity ``error`` (the record is bad): invalid JSON (with line), a missing or empty field, an
  unknown role, ``<image>`` placeholder count != image count, an image missing / unreadable /
  truncated / rejected by the processor, aspect ratio > 200, more than ``max_tokens`` LLM tokens
  (text + merged image tokens), and every occurrence of an id after its first; an audio clip or a
  video (a file or one inside a shard) missing, empty, truncated or undecodable, and a video's audio
  track that is missing, truncated or stops decoding where the record uses it (``use_audio_in_video``:
  ``entrain.data.video.probe_video`` decodes the track in the pass that decodes the frames).
- severity ``error`` too: a record with no supervised (label) token under the tokenizer (no assistant
  text in its chat-formatted conversation, e.g. a chat template that drops it): it has nothing to
  teach; a dataset where no record has one is a one-line error in ``screen_dataset``.
- severity ``converted`` (not bad): grayscale, RGBA, palette, 16-bit, ... images, which are
  converted to RGB8 before processing.
- severity ``warning`` (not bad): an animated image (only its first frame is used); an image path
  that resolves outside the dataset root (``--image-root`` or the data file's folder; an ``error``
  with ``confine_images``); a video's truncated or corrupt audio track that its record does not use.

Errors beyond the record's fields: a chat-template special token (any token the tokenizer treats
as special, e.g. ``<|image_pad|>``, ``<|im_start|>``) typed in a turn's text, and an ``<image>``
placeholder in an assistant turn. A file that cannot be read to its end (a JSON array or JSONL
line cut off, a Parquet file that stops mid-way) is an error in every mode: ``screen_dataset``
raises it even under ``on_bad="skip"``.

``screen_dataset`` is the trainer's entry point: with ``on_bad="error"`` a dataset with any bad
record raises ``BadSamplesError`` (a ``DataError`` whose message is the report); with ``"skip"`` the
bad records are written to ``skipped.jsonl`` and the rest returned. Nothing is dropped silently.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Literal

from entrain.core.errors import DataError
from entrain.core.files import file_problem, printable
from entrain.core.workload.samples import (
    DEFAULT_VISION,
    ImageTokenRule,
    SampleMeta,
    VisionTokenConfig,
    audio_llm_tokens,
)
from entrain.data.llava import IMAGE_PLACEHOLDER, Parsed, Record, iter_parsed, record_audio_frames
from entrain.data.problems import exif_orientation, image_error, open_image, orientation_note, oriented_size
from entrain.data.processing import ProcessImages, conversion_reason, count_tokens
from entrain.data.tokenizer import TextTokenizer, default_tokenizer
from entrain.data.video import AUDIO_IN_VIDEO_FIELD, VideoSettings, probe_video
from entrain.data.video_records import counted_turns, record_videos

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "BadSamplesError",
    "CheckReport",
    "Finding",
    "Screened",
    "check_dataset",
    "screen_dataset",
]

DEFAULT_MAX_TOKENS = 8192
NO_LABEL = "no supervised (label) token"
NO_LABEL_WHY = "the chat-formatted conversation has no assistant text to take the loss on: nothing to learn"
ERROR, CONVERTED, WARNING = "error", "converted", "warning"
UNUSED_TRACK = f"the record does not use its audio track (no {AUDIO_IN_VIDEO_FIELD}), so it trains without it"


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem with one record. ``index`` is the record's 0-based position in ``file``."""

    file: str
    index: int
    id: str | None
    field: str
    reason: str
    severity: str
    line: int | None = None

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "index": self.index,
            "id": self.id,
            "field": self.field,
            "reason": self.reason,
            "severity": self.severity,
            "line": self.line,
        }

    def format(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        rid = f" id '{printable(self.id)}'" if self.id is not None else ""
        return f"{where}: record {self.index}{rid}: {self.field}: {self.reason} [{self.severity}]"


@dataclass
class CheckReport:
    """Findings over ``records`` records; ``complete`` is False when a syntax error stopped reading."""

    records: int = 0
    findings: list[Finding] = field(default_factory=list)
    complete: bool = True
    label_tokens: int = 0
    """Supervised (label) tokens under the tokenizer, over the records without an error."""

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    def _records_with(self, severity: str) -> list[tuple[str, int]]:
        seen: dict[tuple[str, int], None] = {}
        for f in self.findings:
            if f.severity == severity:
                seen[(f.file, f.index)] = None
        return list(seen)

    @property
    def bad(self) -> int:
        """Records with at least one ``error`` finding."""
        return len(self._records_with(ERROR))

    @property
    def converted(self) -> int:
        """Records with at least one converted image."""
        return len(self._records_with(CONVERTED))

    @property
    def ok(self) -> bool:
        return not self.errors

    def bad_ids(self) -> list[str]:
        out: dict[str, None] = {}
        for f in self.errors:
            out[printable(f.id) if f.id is not None else f"record {f.index}"] = None
        return list(out)

    def to_json(self) -> dict:
        return {
            "records": self.records,
            "bad": self.bad,
            "converted": self.converted,
            "complete": self.complete,
            "label_tokens": self.label_tokens,
            "findings": [f.to_json() for f in self.findings],
        }

    def format_text(self, max_findings: int | None = None) -> str:
        shown = self.findings if max_findings is None else self.findings[:max_findings]
        lines = [f.format() for f in shown]
        if len(shown) < len(self.findings):
            lines.append(f"... {len(self.findings) - len(shown)} more finding(s)")
        summary = f"{self.records} record(s): {self.bad} bad, {self.converted} with converted images"
        summary += f", {self.label_tokens} label token(s) in the others"
        if not self.complete:
            summary += " (the file cannot be read to its end; later records were not checked)"
        lines.append(summary)
        if self.bad:
            lines.append("bad ids: " + ", ".join(self.bad_ids()))
        return "\n".join(lines)


class BadSamplesError(DataError):
    """Raised by ``screen_dataset(on_bad="error")``; ``report`` holds every finding."""

    def __init__(self, path: str, report: CheckReport, max_findings: int = 50):
        self.report = report
        reason = (
            f"{report.bad} of {report.records} record(s) are bad (fix them, or pass --on-bad-sample skip "
            f"to train on the rest):\n{report.format_text(max_findings)}"
        )
        super().__init__(path, None, None, reason)


# --- per-record checks -----------------------------------------------------------------------------


@dataclass(slots=True)
class _ImageResult:
    hw: tuple[int, int] | None = None
    tokens: int | None = None
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # (field, reason, severity)


def _short(src) -> str:
    """A path as itself, an image in a shard as ``shard#location``, bytes as their length."""
    return (
        src if isinstance(src, str) else f"<{len(src)} encoded bytes>" if isinstance(src, bytes) else str(src)
    )


def _check_image(
    src: str | bytes, fld: str, vision: ImageTokenRule, processor: ProcessImages | None
) -> _ImageResult:
    from PIL import Image

    res = _ImageResult()
    problem = file_problem(src) if isinstance(src, str) else None
    if problem == "no such file":
        res.problems.append((fld, f"image file not found: {src}", ERROR))
        return res
    if problem is not None:
        res.problems.append((fld, f"image {src}: {problem}", ERROR))
        return res
    try:
        with open_image(src) as im:
            height, width = oriented_size(im)
            orientation = exif_orientation(im)
            mode = im.mode
            frames = getattr(im, "n_frames", 1) if getattr(im, "is_animated", False) else 1
            try:
                im.load()
            except OSError as e:
                kind = "truncated" if "truncated" in str(e).lower() else "unreadable"
                res.problems.append((fld, f"image {kind}: {_short(src)}: {image_error(e)}", ERROR))
                return res
            from PIL import ImageOps

            from entrain.data.processing import to_rgb

            rgb = to_rgb(ImageOps.exif_transpose(im))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        res.problems.append((fld, f"image unreadable: {_short(src)}: {image_error(e)}", ERROR))
        return res
    if frames > 1:
        res.problems.append((fld, f"animated image ({frames} frames): only its first frame is used", WARNING))
    for reason in (conversion_reason(mode), orientation_note(orientation)):
        if reason is not None:
            res.problems.append((fld, reason, CONVERTED))
    ratio = max(width, height) / max(1, min(width, height))
    if ratio > getattr(vision, "max_aspect_ratio", math.inf):  # a tiling family's rule has no limit
        res.problems.append(
            (
                fld,
                f"aspect ratio {ratio:.1f} of a {width}x{height} image > {vision.max_aspect_ratio:g}",
                ERROR,
            )
        )
        return res
    res.hw = (height, width)
    if processor and isinstance(vision, VisionTokenConfig):  # a smart_resize rule's patch grid
        from entrain.data.processing import merged_tokens

        try:
            _, grid = processor([rgb], vision)
            res.tokens = merged_tokens(grid, vision.merge_size)[0]
        except Exception as e:  # noqa: BLE001 - any processor failure rejects the image
            res.problems.append((fld, f"rejected by the image processor: {type(e).__name__}: {e}", ERROR))
    else:
        res.tokens = vision.image_tokens(height, width)
    return res


def special_tokens_in(text: str, tokenizer: TextTokenizer) -> list[str]:
    """The tokenizer's special tokens typed in ``text`` (the ``<image>`` placeholder excepted): the
    tokenizer would turn each into its special id, e.g. a stray ``<|image_pad|>`` into an image slot."""
    return [t for t in tokenizer.special_tokens if t != IMAGE_PLACEHOLDER and t in text]


def _outside(src: str, root: Path) -> bool:
    try:  # realpath, not Path.resolve: a symlink loop is reported by the image check, not raised here
        Path(os.path.realpath(src)).relative_to(root)
    except ValueError:
        return True
    return False


@dataclass(frozen=True, slots=True)
class _Rules:
    tokenizer: TextTokenizer
    max_tokens: int
    vision: ImageTokenRule
    processor: ProcessImages | None
    """The model family's image processor (None: token counts come from ``vision`` alone)."""
    root: Path | None = None
    """The dataset root images should stay under (None: not checked)."""
    confine_images: bool = False
    video: VideoSettings | None = None
    """The model family's video processor numbers (None: ``entrain.data.video``'s defaults)."""
    checked: dict = field(default_factory=dict, compare=False)
    """``(path, [size_bytes, mtime_ns]) -> _ImageResult`` of image files already checked in this scan
    (datasets reuse images), at most ``CHECKED_IMAGES`` at a time."""


CHECKED_IMAGES = 65536


def _image_result(src, fld: str, rules: _Rules) -> _ImageResult:
    """``_check_image`` of ``src``, reused for an image file checked before in this scan with the same
    size and mtime (the result depends on nothing else)."""
    if not isinstance(src, str):
        return _check_image(src, fld, rules.vision, rules.processor)
    from entrain.data.metadata_cache import file_stamp

    stamp = file_stamp(src)
    key = (src, None if stamp is None else tuple(stamp))
    res = rules.checked.get(key)
    if res is None:
        if len(rules.checked) >= CHECKED_IMAGES:  # bounded: start again rather than grow
            rules.checked.clear()
        res = rules.checked[key] = _check_image(src, "", rules.vision, rules.processor)
    return _ImageResult(res.hw, res.tokens, [(fld, reason, severity) for _, reason, severity in res.problems])


def _record_findings(rec: Record, rules: _Rules) -> tuple[list[tuple[str, str, str]], SampleMeta | None]:
    tokenizer, max_tokens, vision = rules.tokenizer, rules.max_tokens, rules.vision
    problems: list[tuple[str, str, str]] = []
    for i, (role, text) in enumerate(rec.turns):
        found = special_tokens_in(text, tokenizer)
        if found:
            problems.append(
                (
                    "conversations",
                    f"turn {i} ({role}) contains the special token(s) {', '.join(found)} of the chat "
                    "template; they cannot appear in text",
                    ERROR,
                )
            )
    sizes, image_tokens = [], 0
    for i, src in enumerate(rec.images):
        if rules.root is not None and isinstance(src, str) and _outside(src, rules.root):
            severity = ERROR if rules.confine_images else WARNING
            problems.append(
                (f"images[{i}]", f"image {src} resolves outside the dataset root {rules.root}", severity)
            )
        res = _image_result(src, f"images[{i}]", rules)
        problems.extend(res.problems)
        if res.hw is not None:
            sizes.append(res.hw)
            image_tokens += res.tokens or 0
    if any(sev == ERROR for _, _, sev in problems):
        return problems, None
    audio, audio_tokens = _record_audio(rec, problems)
    if audio is None:
        return problems, None
    videos, audio, audio_tokens = _record_video(rec, audio, audio_tokens, problems, rules.video)
    if videos is None:
        return problems, None
    image_tokens += SampleMeta("", (), 0, vision, video=videos).video_tokens
    text, answer = count_tokens(counted_turns(rec, tokenizer, rules.video or VideoSettings()), tokenizer)
    if answer == 0:
        problems.append(
            ("conversations", f"{NO_LABEL} under the tokenizer {tokenizer.name} ({NO_LABEL_WHY})", ERROR)
        )
        return problems, None
    if text + image_tokens + audio_tokens > max_tokens:
        with_audio = f" + audio {audio_tokens}" if audio_tokens else ""
        problems.append(
            (
                "conversations",
                f"{text + image_tokens + audio_tokens} tokens (text {text} + image {image_tokens}{with_audio}) "
                f"> max {max_tokens}",
                ERROR,
            )
        )
        return problems, None
    return problems, SampleMeta(rec.id, tuple(sizes), text, vision, answer, audio=audio, video=videos)


def _record_video(rec: Record, audio: tuple[int, ...], audio_tokens: int, problems: list, settings=None):
    """``(video grids, audio frames, audio tokens)`` of a record with its videos (their grids; with
    ``use_audio_in_video`` their tracks among the clips, ``entrain.data.video_records.record_videos``);
    ``(None, ...)`` with an error appended for a video that cannot be read."""
    if not rec.video:
        return (), audio, audio_tokens
    try:
        videos, frames = record_videos(rec, audio, s=settings or VideoSettings())
    except DataError as e:
        problems.append((e.field or rec.video_field, e.reason, ERROR))
        return None, audio, audio_tokens
    if not rec.audio_in_video:  # a bad track the record does not use: named, not fatal
        for i, path in enumerate(rec.video):
            error = probe_video(path).track_error(path)
            if error is not None:
                problems.append(
                    (f"{rec.video_field}[{i}]", f"{path}: {error.problem}; {UNUSED_TRACK}", WARNING)
                )
    return videos, frames, sum(audio_llm_tokens(f) for f in frames)


def _record_audio(rec: Record, problems: list) -> tuple[tuple[int, ...] | None, int]:
    """``(mel frames per clip, their LLM tokens)`` of a record's audio clips; ``(None, 0)`` with an
    error appended for a clip that cannot be read (``entrain.data.llava.record_audio_frames``)."""
    if not rec.audio:
        return (), 0
    try:
        frames = record_audio_frames(rec)
    except DataError as e:
        problems.append((e.field or rec.audio_field, e.reason, ERROR))
        return None, 0
    return frames, sum(audio_llm_tokens(f) for f in frames)


@dataclass
class Screened:
    """A dataset after screening: the usable records with their metadata, and the report."""

    report: CheckReport
    records: list[Record]
    samples: list[SampleMeta]
    skipped_path: Path | None = None


Examined = tuple[Parsed, list[tuple[str, str, str]], SampleMeta | None]
"""A parsed record with its findings ``(field, reason, severity)`` and metadata (None: bad)."""


def _examine(item: Parsed, rules: _Rules, keep: bool = True) -> Examined:
    """The per-record work (images decoded, tokens counted), which may run in a worker process; the
    record comes back without the image bytes its reader held, or not at all unless ``keep``."""
    if item.fatal or item.record is None:
        return item, [], None
    problems, meta = _record_findings(item.record, rules)
    return replace(item, record=item.record.light() if keep else None), problems, meta


def _examine_shard(shard: tuple[Path, str], rules: _Rules, image_root, keep: bool) -> list[Examined]:
    from entrain.data.shards import iter_shard

    return [_examine(item, rules, keep) for item in iter_shard(shard[0], shard[1], image_root)]


def _examined(path, image_root, rules: _Rules, workers: int | None, keep: bool) -> Iterable[Examined]:
    """Every record of ``path`` examined, in order; a folder's shards in parallel processes."""
    from entrain.data.shards import dataset_shards, flatten, map_shards, with_progress

    if not Path(path).is_dir():
        items = with_progress(iter_parsed(path, image_root), f"checking {Path(path).name}")
        return (_examine(item, rules, keep) for item in items)

    root = image_root if image_root is not None else path
    scan = partial(_examine_shard, rules=rules, image_root=root, keep=keep)
    return flatten(
        map_shards(scan, dataset_shards(path), workers=workers, desc=f"checking {Path(path).name}")
    )


def _scan(examined: Iterable[Examined], keep: bool) -> Screened:
    report = CheckReport()
    first_index: dict[str, int] = {}
    """id -> ``file number << 40 | index`` of its first record (an int: 1M ids stay small)."""
    files: dict[str, int] = {}
    good: list[Record] = []
    samples: list[SampleMeta] = []
    for item, problems, meta in examined:
        report.records += 1
        first_finding = len(report.findings)

        def add(fld: str, reason: str, severity: str, item: Parsed = item) -> None:
            report.findings.append(Finding(item.file, item.index, item.id, fld, reason, severity, item.line))

        for fld, reason in item.problems:
            add(fld, reason, ERROR)
        if item.fatal:
            report.complete = False
            break
        if item.id is not None:
            if item.id in first_index:
                add(
                    "id",
                    f"duplicate id (first used by record {_first(first_index[item.id], files, item.file)})",
                    ERROR,
                )
            else:
                first_index[item.id] = files.setdefault(item.file, len(files)) << 40 | item.index
        for fld, reason, severity in problems:  # none for a record that did not parse
            add(fld, reason, severity)
        bad = any(f.severity == ERROR for f in report.findings[first_finding:])
        if meta is not None and not bad:
            report.label_tokens += meta.answer_tokens or 0
        if keep and meta is not None and not bad:
            good.append(item.record)
            samples.append(meta)
    return Screened(report, good, samples)


def _first(where: int, files: dict[str, int], file: str) -> str:
    """The first record of a duplicated id (``file number << 40 | index``): its index, and its file
    when another (a shard)."""
    number, index = where >> 40, where & ((1 << 40) - 1)
    if files.get(file) == number:
        return str(index)
    return f"{index} of {next(f for f, n in files.items() if n == number)}"


def check_dataset(
    path: str | Path,
    image_root: str | Path | None = None,
    tokenizer: TextTokenizer | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    vision: ImageTokenRule = DEFAULT_VISION,
    *,
    processor: ProcessImages | None = None,
    confine_images: bool = False,
    workers: int | None = None,
    video: VideoSettings | None = None,
) -> CheckReport:
    """Check every record of ``path`` (a file or a sharded dataset folder, whose shards are checked
    in up to ``workers`` processes). ``processor``: the model family's image processor, built before
    the call (``ModelFamily.image_processing``), run on every image; None skips it (images are still
    fully decoded; token counts then come from ``vision``).
    ``confine_images``: an image outside the dataset root is an error (else a warning). ``video``: the
    model family's video processor numbers (``ModelFamily.video_settings_for``; None: the defaults)."""
    rules = _rules(path, image_root, tokenizer, max_tokens, vision, processor, confine_images, video)
    return _scan(_examined(path, image_root, rules, workers, keep=False), keep=False).report


def _rules(path, image_root, tokenizer, max_tokens, vision, processor, confine_images, video=None) -> _Rules:
    tok = tokenizer if tokenizer is not None else default_tokenizer()
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    root = Path(image_root if image_root is not None else folder).resolve()
    return _Rules(tok, max_tokens, vision, processor, root, confine_images, video)


def unreadable_to_end(report: CheckReport) -> Finding | None:
    """The finding that stopped reading (a file cut off or corrupt mid-way), if any."""
    return None if report.complete else report.errors[-1]


def _skipped_lines(report: CheckReport) -> list[dict]:
    grouped: dict[tuple[str, int], dict] = {}
    for f in report.errors:
        entry = grouped.setdefault(
            (f.file, f.index), {"file": f.file, "index": f.index, "line": f.line, "id": f.id, "reasons": []}
        )
        entry["reasons"].append({"field": f.field, "reason": f.reason})
    return list(grouped.values())


def _check_labels(path, report: CheckReport, tokenizer: TextTokenizer) -> None:
    """One line when no record of ``path`` has a supervised token under ``tokenizer`` (e.g. a chat
    template that emits no assistant text): the run would have nothing to learn."""
    unlabelled = {(f.file, f.index) for f in report.errors if f.reason.startswith(NO_LABEL)}
    if report.records and len(unlabelled) == report.records:
        raise DataError(
            str(path), None, None,
            f"none of its {report.records} record(s) has a supervised (label) token under the tokenizer {tokenizer.name} "
            "(its chat template emits no assistant text?): nothing to learn; check it with "
            "`entrain data check PATH --tokenizer DIR`",
        )  # fmt: skip


def screen_dataset(
    path: str | Path,
    *,
    on_bad: Literal["error", "skip"] = "error",
    out_dir: str | Path | None = None,
    image_root: str | Path | None = None,
    tokenizer: TextTokenizer | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    vision: ImageTokenRule = DEFAULT_VISION,
    processor: ProcessImages | None = None,
    confine_images: bool = False,
    workers: int | None = None,
    video: VideoSettings | None = None,
) -> Screened:
    """Check ``path`` before training and return its usable records with their ``SampleMeta``.

    ``on_bad="error"``: any bad record raises ``BadSamplesError`` (the report, before any training).
    ``on_bad="skip"``: bad records are left out and listed, one JSON object per record with every
    reason, in ``out_dir/skipped.jsonl`` (written even when empty; ``out_dir`` is required).
    """
    if on_bad not in ("error", "skip"):
        raise ValueError(f"on_bad must be 'error' or 'skip', got {on_bad!r}")
    if on_bad == "skip" and out_dir is None:
        raise ValueError("on_bad='skip' needs out_dir for skipped.jsonl")
    rules = _rules(path, image_root, tokenizer, max_tokens, vision, processor, confine_images, video)
    screened = _scan(_examined(path, image_root, rules, workers, keep=True), keep=True)
    report = screened.report
    stop = unreadable_to_end(report)
    if stop is not None:  # never train on the part of a file before a cut: an error in every mode
        raise DataError(
            stop.file, stop.line if stop.line is not None else f"#{stop.index}", None, stop.reason
        )
    _check_labels(path, report, rules.tokenizer)
    if on_bad == "error" and not report.ok:
        raise BadSamplesError(str(path), report)
    if on_bad == "skip":
        out = Path(out_dir) / "skipped.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            for entry in _skipped_lines(report):
                f.write(json.dumps(entry) + "\n")
        screened.skipped_path = out
    if not screened.records:
        raise DataError(str(path), None, None, "no usable records")
    return screened
