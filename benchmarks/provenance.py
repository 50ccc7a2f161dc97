"""The commit and command a benchmark's results came from. A script records them in its JSON
(``"source": {"commit", "command"}``) and as its report's ``Source: commit X, `command` `` line under
the title (the line ``tests/test_doc_claims.py`` checks); a report re-rendered from a JSON keeps the
JSON's source."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def source(recorded: dict | None = None) -> dict:
    """``recorded``'s ``source`` when it has one (a re-render), else this checkout's HEAD (``+dirty`` when
    the working tree differs from it) and the command this process runs."""
    if recorded and "source" in recorded:
        return recorded["source"]
    git = ["git", "-C", str(HERE)]
    head = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    command = " ".join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    return {"commit": head + ("+dirty" if dirty.stdout.strip() else ""), "command": command}


def stamped(report: str, *sources: dict) -> str:
    """``report`` with one ``Source:`` line a source, under the title (replacing any there)."""
    lines = report.split("\n")
    rest = [x for x in lines[1:] if not x.startswith("Source: commit ")]
    while rest and not rest[0].strip():
        rest.pop(0)
    stamps = [f"Source: commit {s['commit']}, `{s['command']}`" for s in sources]
    return "\n".join([lines[0], "", *stamps, "", *rest])
