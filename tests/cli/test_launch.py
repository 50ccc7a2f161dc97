"""``entrain.cli.launch.launch``: how the torchrun group ended becomes ``entrain train``'s exit status,
and a re-plan's exit starts the group again on the re-plan's flags (torchrun itself is stubbed)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from entrain.cli import launch, train_args
from entrain.runtime.launcher import ERROR_EXIT, INTERRUPTED_EXIT
from entrain.runtime.replan import REPLAN_EXIT


@pytest.fixture
def started(monkeypatch):
    """The argv of every torchrun start; each start ends as the next of ``started.ends``."""
    runs: list[list[str]] = []
    ends: list[tuple[int, list[str]]] = []

    def start(argv, nproc):
        runs.append(argv)
        return ends.pop(0)

    monkeypatch.setattr(launch, "_start_workers", start)
    monkeypatch.setattr(train_args, "child_argv", lambda args: [args.plan])
    monkeypatch.setattr(train_args, "relaunch_args", lambda args, spec: argparse.Namespace(plan="replanned"))
    return SimpleNamespace(runs=runs, ends=ends)


def _spec(tmp_path):
    return SimpleNamespace(
        run=SimpleNamespace(out=str(tmp_path), steps=4), schedule=SimpleNamespace(systems=("x",))
    )


@pytest.mark.parametrize(
    "ends, status, runs, stderr",
    [
        ([(0, [])], 0, ["first"], ""),
        ([(REPLAN_EXIT, []), (0, [])], 0, ["first", "replanned"], ""),
        ([(REPLAN_EXIT, ["boom"])], ERROR_EXIT, ["first"], "entrain train: error: boom\n"),
        (
            [(INTERRUPTED_EXIT, [])],
            INTERRUPTED_EXIT,
            ["first"],
            "interrupted at step 0; continue with --resume\n",
        ),
        ([(7, [])], 7, ["first"], "exit status 7"),
    ],
)
def test_the_group_ends_as_its_workers_did(started, tmp_path, capsys, ends, status, runs, stderr):
    started.ends[:] = ends
    assert launch.launch(argparse.Namespace(plan="first"), _spec(tmp_path), 2) == status
    assert [argv[0] for argv in started.runs] == runs
    assert stderr in capsys.readouterr().err
