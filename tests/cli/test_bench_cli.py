"""``entrain bench paper --quick``: writes the report and its JSON (validated against
entrain/schemas/bench.json); --json prints the same object."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema

from entrain.cli.main import main


def test_quick_bench_writes_report_and_schema_valid_json(tmp_path, capsys):
    out = tmp_path / "paper.md"
    assert main(["bench", "paper", "--quick", "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((tmp_path / "paper.json").read_text())
    assert printed == written
    schema = json.loads(resources.files("entrain").joinpath("schemas/bench.json").read_text())
    jsonschema.validate(written, schema)
    (case,) = written["cases"]
    assert (case["dataset"], case["model"], case["hardware"]) == (
        "synthchartnet",
        "qwen25vl-llama3-1b",
        "a40-paper",
    )
    names = {
        "entrain",
        "entrain-1f1b",
        "1f1b",
        "disttrain",
        "disttrain-paper",
        "dip",
        "dip-greedy",
        "entrain+ramp",
    }
    assert set(case["systems"]) == names
    assert case["systems"]["entrain"]["entrain_speedup"] == 1.0
    assert {t["batch_size"] for t in case["trials"]} >= {1, 4, 16, 64, 256}
    gap = case["gap"]
    total = (
        gap["ideal_ms"]
        + gap["partition_granularity_ms"]
        + gap["microbatch_residual_ms"]
        + gap["communication_ms"]
    )
    assert abs(total - gap["iteration_time_ms"]) < 1e-6 * gap["iteration_time_ms"]
    assert set(case["sweep"]) == {f"{e}:{8 - e}" for e in range(1, 8)}
    text = out.read_text()
    for section in (
        "## Targets",
        "## Fig. 11",
        "## Table 1",
        "## Tables 2",
        "## Table 3",
        "## Fig. 13",
        "## Fig. 14",
        "gap to `ideal_ms`",
        "## Analysis",
    ):
        assert section in text
