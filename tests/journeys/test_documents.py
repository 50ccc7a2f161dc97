"""Every command of ``README.md`` and ``docs/*.md``, read from the markdown and run as written (sizes
reduced by ``ENTRAIN_JOURNEY_SCALE``, docs/journeys.md), each block in one fresh folder, in order:
exit status 0, the files it promises, JSON that parses, and ``train``'s run folder recording the
flags it was given (tests/journeys/outcomes.py). A command no journey covers fails the first test."""

from __future__ import annotations

import re

import pytest

from tests.journeys.documents import ROOT, SKIPPED, every_command
from tests.journeys.outcomes import CHECKS, Ran
from tests.journeys.runner import argv_of, in_order, prerequisites, run
from tests.journeys.scale import TINY

COMMANDS = every_command()
BLOCKS = list(dict.fromkeys((c.doc, c.block) for c in COMMANDS if not c.skip_reason()))


def test_every_documented_command_has_a_journey_or_a_reason():
    uncovered = [c.where for c in COMMANDS if not c.skip_reason() and c.subcommand not in CHECKS]
    assert not uncovered, (
        "documented commands no journey runs (add a check or a SKIPPED reason):\n" + "\n".join(uncovered)
    )
    stale = [
        key for key in SKIPPED if not any(c.doc == key[0] and re.search(key[1], c.text) for c in COMMANDS)
    ]
    assert not stale, f"SKIPPED entries that match no documented command: {stale}"


def test_the_reductions_are_the_documented_ones():
    """docs/journeys.md's table lists every rewrite ``TINY`` makes (flag and tiny value)."""
    page = (ROOT / "docs" / "journeys.md").read_text(encoding="utf-8")
    rows = [line for line in page.splitlines() if line.startswith("|")]
    for rule in TINY:
        expected = [f"`{rule.subcommand}`", f"`{rule.flag}" + (f" {rule.value}`" if rule.value else "`")]
        assert any(all(e in row for e in expected) for row in rows), f"docs/journeys.md lacks {rule}"


def _block_id(key: tuple[str, int]) -> str:
    """``README.md#commands``: the document and the heading above the block."""
    first = next(c for c in COMMANDS if (c.doc, c.block) == key)
    heading, fenced = "", False
    for line in (ROOT / first.doc).read_text(encoding="utf-8").splitlines()[: first.line]:
        fenced ^= line.startswith("```")
        heading = line.lstrip("#").strip() if line.startswith("#") and not fenced else heading
    slug = re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-") or "top"
    return f"{first.doc}#{slug}"


@pytest.mark.parametrize("key", BLOCKS, ids=[_block_id(k) for k in BLOCKS])
def test_a_documented_block_runs_as_written(key, tmp_path, monkeypatch, capsys, place_stock):
    doc, _ = key
    place_stock(tmp_path)
    monkeypatch.chdir(tmp_path)
    block = [c for c in COMMANDS if (c.doc, c.block) == key and not c.skip_reason()]
    document = [c for c in COMMANDS if c.doc == doc]
    failed = []
    for command in prerequisites(block, document) + in_order(block):  # all: one failure hides no other
        argv = argv_of(command)
        rc = run(argv, command.env)
        out, err = capsys.readouterr()
        if rc != 0:
            failed.append(f"{command.where}\n  ran: {' '.join(argv)}\n  exit {rc}: {err[-2000:]}")
            continue
        try:
            CHECKS[command.subcommand](Ran(command.subcommand, argv, tmp_path, out))
        except Exception as e:  # noqa: BLE001 - a failed check, reported with the others
            failed.append(f"{command.where}\n  ran: {' '.join(argv)}\n  {type(e).__name__}: {e}")
    assert not failed, "\n".join(failed)
