"""The commands the documentation shows, read from the markdown itself (never copied into a test).

A command is a line of a fenced block (```sh, ```bash or an untagged ```) of ``README.md`` or
``docs/*.md`` whose first word (after ``NAME=value`` environment assignments) is ``entrain``,
``python``, ``torchrun`` or ``pip``; ``\\`` continues a line, ``#`` starts a comment, ``a && b`` is two
commands, and a line ``M="..."`` sets a variable that later lines of the block use as ``$M``.
``SKIPPED`` is the one list of commands that cannot run here, each with its reason; every other
command is run by a journey (tests/journeys/test_documents.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ("entrain", "python", "torchrun", "pip")
SHELLS = ("", "sh", "bash", "shell", "console")
_FENCE = re.compile(r"^```(\w*)\s*$")
_COMMAND = re.compile(rf"^(?:\w+=\S*\s+)*(?:{'|'.join(PROGRAMS)})(?:\s|$)")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")

SKIPPED: dict[tuple[str, str], str] = {
    ("README.md", r"^pip install "): "installs packages from the network; CI installs them before the suite runs",
    ("README.md", r"^python -m pytest -q -x"): "the test suite itself: running it from inside the suite would recurse",
    ("README.md", r"^torchrun --nnodes 2 "): "multi-node: needs a second host (HOST0:29400) and a shared /shared folder",
    ("docs/gpu.md", r"^python -m pytest -q -m gpu "): "selects the gpu tests only, which need CUDA (the suite skips them)",
    ("docs/gpu.md", r"^python benchmarks/gpu_check\.py$"): "GPU-only: profiles on CUDA; without it the script exits 2",
    ("docs/gpu.md", r"^python benchmarks/gpu_check\.py \["): "a synopsis of the flags ([optional] parts), not a command",
    ("docs/journeys.md", r"^python -m pytest -q tests/journeys$"): "the journeys themselves (at full size): they would recurse",
    ("docs/profiling.md", r"^entrain profile --model tiny\|"): "a synopsis of the flags (a|b choices), not a command",
}  # fmt: skip
"""(document, regex on ``Command.text``) -> why the command does not run in the journeys."""


@dataclass(frozen=True)
class Command:
    doc: str
    """The document's path relative to the repository, e.g. ``docs/workloads.md``."""
    block: int
    """Which fenced block of the document (0-based, counting every fence)."""
    line: int
    text: str
    """The command as written (continuations joined, comment cut, ``$VAR`` expanded, no env prefix)."""
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def program(self) -> str:
        return self.argv[0]

    @property
    def subcommand(self) -> str:
        """``entrain data synth ...`` -> ``data synth``; ``python -c ...`` -> ``python -c``."""
        words = self.argv[1:3] if self.argv[1:2] in (("data",), ("bench",)) else self.argv[1:2]
        return " ".join(words) if self.program == "entrain" else " ".join(self.argv[:2])

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"

    def skip_reason(self) -> str | None:
        return next(
            (why for (doc, rx), why in SKIPPED.items() if doc == self.doc and re.search(rx, self.text)), None
        )


def documents() -> list[str]:
    return ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]


def _blocks(text: str) -> list[tuple[int, list[tuple[int, str]]]]:
    """Every fenced block whose language is a shell's (or none): its index and ``(line number, line)``s."""
    out: list[tuple[int, list[tuple[int, str]]]] = []
    language: str | None = None  # None: outside a block
    for number, line in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(line.strip())
        if fence and language is None:
            language = fence.group(1)
            out.append((len(out), []))
        elif fence and not fence.group(1):
            language = None
        elif language in SHELLS:
            out[-1][1].append((number, line))
    return [(index, lines) for index, lines in out if lines]


def _joined(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Lines with their ``\\`` continuations joined, each with its first line's number."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in lines:
        start, text = pending or (number, "")
        text += line.rstrip()
        if text.endswith("\\"):
            pending = (start, text[:-1].rstrip() + " ")
            continue
        pending = None
        out.append((start, text.strip()))
    return out


def _words(text: str, variables: dict[str, str]) -> list[str]:
    expanded = re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), text)
    return shlex.split(expanded, comments=True)


def block_commands(doc: str, block: int, lines: list[tuple[int, str]]) -> list[Command]:
    variables: dict[str, str] = {}
    out: list[Command] = []
    for number, line in _joined(lines):
        if not line or line.startswith("#"):
            continue
        assignment = _ASSIGNMENT.match(line)
        if assignment and " " not in line.split("=", 1)[0] and not _words(line, {})[1:]:
            variables[assignment.group(1)] = _words(assignment.group(2), variables)[0]
            continue
        for part in line.split("&&"):
            if not _COMMAND.match(part.strip()):
                continue  # a diagram's or a synopsis's continuation line
            words = _words(part, variables)
            env = {}
            while words and _ASSIGNMENT.match(words[0]):
                name, value = words.pop(0).split("=", 1)
                env[name] = value
            if words and words[0] in PROGRAMS:
                out.append(Command(doc, block, number, " ".join(words), tuple(words), env))
    return out


def commands(doc: str) -> list[Command]:
    text = (ROOT / doc).read_text(encoding="utf-8")
    return [c for index, lines in _blocks(text) for c in block_commands(doc, index, lines)]


def every_command() -> list[Command]:
    return [c for doc in documents() for c in commands(doc)]
