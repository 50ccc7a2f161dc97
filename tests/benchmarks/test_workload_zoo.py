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


def test_a_system_whose_setup_cannot_be_built_renders_as_no_plan(benchmarks_on_path):
    """A row where DIP's configuration cannot be built: its cells say so, it is no baseline, no miss."""
    zoo = importlib.import_module("workload_zoo")
    row = {"iteration_time_ms": 2000.0, "fits_memory": True, "lower_bound_ms": 1000.0, "bubble_ratio": 0.1,
           "encoder_fwd_std_ms": 1.0, "llm_fwd_std_ms": 1.0, "recompute": ["none"], "peak_memory_gb": 1.0,
           "partition_ideal_ms": 1900.0, "degrees": "DP 1"}  # fmt: skip
    gone = {"fits_memory": False, "not_built": "cannot be built: cannot split 29 layers into 64 stages"}
    systems = {n: (dict(gone) if n.startswith("dip") else dict(row)) for n in zoo.SYSTEMS}
    case = {"dataset": "mixture", "model": "Qwen3VL-30B-A3B", "iterations": 1, "systems": systems,
            "best_fitting_baseline": "1f1b", "entrain_vs_best_fitting_baseline": 1.0,
            "entrain_vs_partition_ideal": 1.05, "entrain_without_recompute": None, "ablations": {}}  # fmt: skip
    assert zoo.misses(case) == []
    md = zoo.render({"iterations": 1, "elapsed_s": 1.0, "cases": [case]})
    line = next(x for x in md.splitlines() if x.startswith("| mixture"))
    assert line.count("**no plan**") == 3 and "2.0" in line


def test_merge_renders_a_row_recorded_before_a_system_existed(benchmarks_on_path, tmp_path):
    """An older row without some of ``SYSTEMS`` (recorded with seven) renders '-' there; the merge does
    not stop half-written."""
    zoo = importlib.import_module("workload_zoo")
    row = {"iteration_time_ms": 2000.0, "fits_memory": True, "lower_bound_ms": 1000.0, "bubble_ratio": 0.1,
           "encoder_fwd_std_ms": 1.0, "llm_fwd_std_ms": 1.0, "recompute": ["none"], "peak_memory_gb": 1.0,
           "partition_ideal_ms": 1900.0, "degrees": "DP 1"}  # fmt: skip
    old = [n for n in zoo.SYSTEMS if n not in ("encoder-rebalance", "dflop")]
    case = {"dataset": "docvqa", "model": "1B", "iterations": 3, "systems": {n: dict(row) for n in old},
            "best_fitting_baseline": "1f1b", "entrain_vs_best_fitting_baseline": 1.0,
            "entrain_vs_partition_ideal": 1.05, "entrain_without_recompute": None, "ablations": {}}  # fmt: skip
    part = tmp_path / "old.json"
    part.write_text(json.dumps({"iterations": 3, "elapsed_s": 1.0, "cases": [case]}))
    out = tmp_path / "zoo"
    assert zoo.main(["--merge", str(part), "--out", str(out)]) == 0
    line = next(x for x in out.with_suffix(".md").read_text().splitlines() if x.startswith("| docvqa"))
    assert line.count(" - |") >= 2 and "2.0" in line
