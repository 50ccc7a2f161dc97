"""Error types. Bad user input raises a subclass of ``EntrainError`` with a one-line message."""

from __future__ import annotations

from entrain.core.files import printable


class EntrainError(Exception):
    """Base class of every error Entrain reports to a user (the CLI prints it without a traceback)."""


class ConfigError(EntrainError, ValueError):
    """An impossible or inconsistent configuration (layout, batch sizes, flags)."""


class DataError(EntrainError, ValueError):
    """A bad input record. The message names the file, the record (line or index) and the field."""

    def __init__(self, path: str, record: int | str | None, field: str | None, reason: str):
        self.path, self.record, self.field, self.reason = str(path), record, field, reason
        where = printable(self.path if record is None else f"{self.path}:{record}")
        what = f" field '{printable(field)}':" if field else ""
        super().__init__(f"{where}:{what} {reason}")

    def __reduce__(self):  # rebuilt from its parts (a shard scanned in another process raises it)
        return (type(self), (self.path, self.record, self.field, self.reason))


class ScheduleError(EntrainError, ValueError):
    """A broken Plan; the message carries the per-rank action grid with the offending step marked."""
