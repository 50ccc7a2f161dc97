"""The normalised conversation record every reader yields (LLaVA JSON/JSONL, Parquet) and the
types the image and text processing read; no reader code, so the readers and the processing
import it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["IMAGE_PLACEHOLDER", "ROLES", "Record", "Parsed"]

IMAGE_PLACEHOLDER = "<image>"
ROLES: dict[str, str] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}
"""Accepted speaker names and the chat role each maps to."""


@dataclass(frozen=True, slots=True)
class Record:
    """One normalised sample.

    ``images`` holds resolved file paths (``str``) or encoded image bytes (Parquet);
    ``turns`` holds ``(role, text)`` with role in ``system``/``user``/``assistant`` and ``<image>``
    placeholders left in the text. ``index`` is the record's 0-based position in ``file``;
    ``line`` its 1-based line where known.
    """

    id: str
    images: tuple[str | bytes, ...]
    turns: tuple[tuple[str, str], ...]
    file: str = ""
    index: int = 0
    line: int | None = None

    @property
    def image_paths(self) -> tuple[str, ...]:
        return tuple(i for i in self.images if isinstance(i, str))

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
