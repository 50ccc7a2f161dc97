"""Run documented commands in a folder: ``entrain`` in-process through ``entrain.cli.main.main`` (its
``train`` front process starting forked ranks, tests/journeys/forked_launch.py), ``python -c CODE``
as ``exec`` in the folder; commands in document order, except that one reading a path a later
command of the same block writes (``profile --from-trace run/`` before ``train --out run/``) waits
for that writer; before a block, the earlier commands that make what it reads (``prerequisites``)."""

from __future__ import annotations

import os

from tests.journeys.documents import Command
from tests.journeys.outcomes import inputs, outputs
from tests.journeys.scale import reduced


def _norm(path: str) -> str:
    return os.path.normpath(path)


def _within(path: str, folder: str) -> bool:
    path, folder = _norm(path), _norm(folder)
    return path == folder or path.startswith(folder + os.sep)


def argv_of(command: Command) -> list[str]:
    """The command line as run: sizes reduced (``ENTRAIN_JOURNEY_SCALE``)."""
    return (
        reduced(command.subcommand, list(command.argv))
        if command.program == "entrain"
        else list(command.argv)
    )


def in_order(block: list[Command]) -> list[Command]:
    """Document order, each reader after the later writers of what it reads."""
    pending, out = list(block), []
    while pending:
        for command in pending:
            reads = inputs(command.subcommand, argv_of(command))
            others = [c for c in pending if c is not command]
            writes = [w for c in others for w in outputs(c.subcommand, argv_of(c))]
            if not any(_within(r, w) for r in reads for w in writes):
                break
        else:
            command = pending[0]  # a cycle: document order
        pending.remove(command)
        out.append(command)
    return out


def prerequisites(block: list[Command], document: list[Command]) -> list[Command]:
    """The earlier commands of the document that write what the block reads but does not write
    itself (the README's recipes read the ``ds/`` its command list synthesises), the last writer of
    each path, in document order."""
    written = [w for c in block for w in outputs(c.subcommand, argv_of(c))]
    needed = [
        r for c in block for r in inputs(c.subcommand, argv_of(c)) if not any(_within(r, w) for w in written)
    ]
    earlier = [c for c in document if c.block < block[0].block and not c.skip_reason()]
    found: list[Command] = []
    for path in needed:
        writers = [c for c in earlier if any(_within(path, w) for w in outputs(c.subcommand, argv_of(c)))]
        if writers and writers[-1] not in found:
            found.append(writers[-1])
    return sorted(found, key=document.index)


def run_python(argv: list[str]) -> int:
    """``python -c CODE`` in this process (the folder is the working directory)."""
    assert argv[1] == "-c", f"{argv}: only python -c runs in a journey"
    exec(compile(argv[2], "<documented python -c>", "exec"), {"__name__": "__main__"})
    return 0


def run(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run one command with its documented ``NAME=value`` environment (restored afterwards)."""
    from entrain.cli.main import main

    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    try:
        if argv[0] == "python":
            return run_python(argv)
        assert argv[0] == "entrain", argv
        return main(argv[1:])
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
