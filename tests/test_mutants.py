"""benchmarks/mutants.py stays in step with the code: every mutant's search string occurs exactly
once in its file (a refactor that moves the target must update the mutant, not silence it), and
the tests named to kill it exist."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mutants", ROOT / "benchmarks" / "mutants.py")
mutants = importlib.util.module_from_spec(spec)
sys.modules["mutants"] = mutants  # dataclasses look their module up
spec.loader.exec_module(mutants)


@pytest.mark.parametrize("m", mutants.MUTANTS, ids=lambda m: m.name)
def test_mutant_applies_and_names_existing_tests(m):
    original, mutated = mutants.mutated_text(m, ROOT)
    assert mutated != original
    for node in (*m.tests, *m.fast):
        path = node.split("::")[0]
        assert (ROOT / path).is_file(), f"{m.name}: {path} does not exist"
        if "::" in node:
            name = node.split("::")[1].split("[")[0]
            assert f"def {name}(" in (ROOT / path).read_text(), f"{m.name}: no test {name} in {path}"


def test_a_moved_target_is_reported(tmp_path):
    m = mutants.MUTANTS[0]
    (tmp_path / m.path).parent.mkdir(parents=True)
    (tmp_path / m.path).write_text("refactored away\n")
    with pytest.raises(mutants.MutantDoesNotApply, match=f"mutant {m.name} no longer applies"):
        mutants.mutated_text(m, tmp_path)


def test_fast_mode_exits_non_zero_when_a_mutant_survives(monkeypatch, capsys):
    survived = {"name": "deferral-off", "killed": False, "failed": [], "seconds": 1.0, "rc": 0}
    monkeypatch.setattr(mutants, "run", lambda ms, fast: [None, survived])
    monkeypatch.setattr(sys, "argv", ["mutants.py", "--fast", "--only", "deferral-off"])
    assert mutants.main() == 1
    assert "SURVIVED: deferral-off" in capsys.readouterr().out
    monkeypatch.setattr(mutants, "run", lambda ms, fast: [None, dict(survived, killed=True, rc=1)])
    assert mutants.main() == 0


def test_every_mutant_has_a_unique_name():
    names = [m.name for m in mutants.MUTANTS]
    assert len(set(names)) == len(names)


def test_the_report_names_its_source_commit_and_command():
    row = {"name": "deferral-off", "killed": True, "failed": ["t::x"], "seconds": 1.0, "rc": 1}
    text = mutants.report([None, row], mutants.MUTANTS, fast=True)
    head = mutants._commit().split()[0]
    assert f"Source: commit {head}, `python benchmarks/mutants.py --fast`" in text
    assert "**1 of 1 mutants killed**" in text and "| deferral-off |" in text
