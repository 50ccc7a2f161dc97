"""A throw-away git repository for the regression guard's tests (rebaseline guard, stale results)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    """``git args`` in ``repo`` with a fixed author; its stdout, stripped."""
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
