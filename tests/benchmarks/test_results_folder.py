"""``benchmarks/results/`` stays small and every file in it has a front door: at most 30 files, each
named (by its stem) in ``benchmarks/README.md``, so a reader finds the script and command behind it."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
MAX_RESULT_FILES = 30


def unlisted(results: Path, readme: str) -> list[str]:
    """The results files whose stem (name without ``.md`` / ``.json``) the README does not name."""
    return sorted(p.name for p in results.iterdir() if p.is_file() and p.stem not in readme)


def test_the_results_folder_holds_at_most_30_files():
    files = [p for p in (BENCHMARKS / "results").iterdir() if p.is_file()]
    assert len(files) <= MAX_RESULT_FILES, sorted(p.name for p in files)


def test_every_results_file_is_named_in_the_readme():
    assert unlisted(BENCHMARKS / "results", (BENCHMARKS / "README.md").read_text()) == []


def test_an_unlisted_file_is_caught(tmp_path):
    (tmp_path / "zoo.md").write_text("x")
    (tmp_path / "orphan_pass_rerun.json").write_text("{}")
    assert unlisted(tmp_path, "| `zoo.py` | ... | `zoo.md` |") == ["orphan_pass_rerun.json"]
