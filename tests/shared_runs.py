"""One expensive computation made once per test session for the tests that make it with the same
arguments, whichever ``pytest -n`` worker runs them: the first caller computes and keeps the result as
JSON in the session's shared temporary folder, the others (waiting on a lock while it computes) read it.
Nothing is kept from one session to the next.

``bench paper --quick``'s numbers (``entrain.cli.bench.bench_paper``, deterministic: every simulation
seeded) are one: tests/cli/test_bench_cli.py and the README's command journey
(tests/journeys/test_documents.py) both run the command through ``entrain.cli.main.main``; only the
second one's ``bench_paper`` call is answered from the first's."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path


def session_folder(tmp_path_factory) -> Path:
    """The folder every worker of this session shares (``pytest -n``: the parent of the workers' own
    temporary folders; a session without workers: its own)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
    folder.mkdir(exist_ok=True)
    return folder


def once(folder: Path, key: str, compute: Callable[[], object]):
    """``compute()`` for the session's first caller of ``key`` (its result kept as JSON in ``folder``);
    for the others, that JSON read back. A caller that raises keeps nothing: the next one computes."""
    name = hashlib.sha256(key.encode()).hexdigest()[:16]
    kept = folder / f"{name}.json"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if kept.exists():
                return json.loads(kept.read_text())
            result = compute()
            kept.write_text(json.dumps(result))
            return result
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def share_bench_paper(monkeypatch, folder: Path) -> None:
    """``entrain.cli.bench.bench_paper`` answered by ``once`` (keyed on every argument but ``log``) for
    the rest of the test: the command's flags, report, files and printed JSON stay its own."""
    from entrain.cli import bench

    real = bench.bench_paper

    def shared(**kwargs):
        args = {k: v for k, v in kwargs.items() if k != "log"}
        return once(folder, f"bench_paper {sorted(args.items())!r}", lambda: real(**kwargs))

    monkeypatch.setattr(bench, "bench_paper", shared)
