"""benchmarks/workload_zoo.py --merge: a later part's row replaces an earlier one of the same workload and
model in its place, and the header names the rows run with another iteration count."""

from __future__ import annotations

import importlib
import json


def _case(dataset: str, model: str, iterations: int, ms: float) -> dict:
    return {"dataset": dataset, "model": model, "iterations": iterations, "error": f"{ms}"}


def test_merge_replaces_a_row_in_place_and_names_its_iteration_count(benchmarks_on_path, tmp_path):
    zoo = importlib.import_module("workload_zoo")
    old = {"iterations": 3, "elapsed_s": 9.0,
           "cases": [_case("docvqa", "1B", 3, 1.0), _case("docvqa", "QwenVL-7B", 1, 2.0),
                     _case("text-heavy", "QwenVL-7B", 1, 3.0), _case("docvqa", "OV-7B", 1, 4.0)]}  # fmt: skip
    new = {"iterations": 3, "elapsed_s": 5.0, "cases": [_case("text-heavy", "QwenVL-7B", 3, 5.0)]}
    paths = [tmp_path / "old.json", tmp_path / "new.json"]
    for p, res in zip(paths, (old, new)):
        p.write_text(json.dumps(res))
    out = tmp_path / "zoo"
    assert zoo.main(["--merge", *map(str, paths), "--out", str(out)]) == 0
    got = json.loads(out.with_suffix(".json").read_text())
    assert [(c["dataset"], c["model"], c["error"]) for c in got["cases"]] == [
        ("docvqa", "1B", "1.0"), ("docvqa", "QwenVL-7B", "2.0"), ("text-heavy", "QwenVL-7B", "5.0"),
        ("docvqa", "OV-7B", "4.0"),
    ]  # fmt: skip
    assert "3 iteration(s) (1 for the OV-7B/docvqa QwenVL-7B rows)" in out.with_suffix(".md").read_text()
