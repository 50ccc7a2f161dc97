"""What is wrong with a path a user gave, in words, and text made safe to print.

``file_problem`` tells a missing file from a directory, FIFO or device (which must not be opened:
reading a FIFO blocks). ``printable`` escapes control characters of user data (ids, paths) before
they reach a terminal.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["file_problem", "printable"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_problem(path: str | os.PathLike) -> str | None:
    """None if ``path`` is a readable regular file, else why not: ``no such file``, ``not a regular
    file (a directory)`` (FIFO, device, socket), ``permission denied``."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "no such file"
    except PermissionError:
        return "permission denied"
    except OSError as e:
        return e.strerror or type(e).__name__
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "a special file")
        return f"not a regular file ({kind})"
    if not os.access(path, os.R_OK):
        return "permission denied"
    return None


def printable(text: object) -> str:
    """``text`` with control and other non-printable characters escaped (``\\n``, ``\\x1b``,
    ``\\u200b``), so a record id or path cannot move the cursor or hide in a message."""
    s = str(text) if not isinstance(text, Path) else os.fspath(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)
