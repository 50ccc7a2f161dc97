"""A benchmark's report carries its Source line under the title (replacing an old one), the JSON the
same commit and command, and a re-render keeps the recorded run's source (``benchmarks/provenance.py``)."""

from __future__ import annotations

import importlib
import re
import sys

import pytest


@pytest.fixture(scope="module")
def provenance(benchmarks_on_path):
    return importlib.import_module("provenance")


def test_the_source_line_goes_under_the_title_once(provenance):
    src = {"commit": "abc1234", "command": "python benchmarks/x.py --quick"}
    want = "# Title\n\nSource: commit abc1234, `python benchmarks/x.py --quick`\n\nBody.\n"
    assert provenance.stamped("# Title\n\nBody.\n", src) == want
    old = "# Title\n\nSource: commit 0000000, `python benchmarks/x.py`\n\nBody.\n"
    assert provenance.stamped(old, src) == want


def test_a_run_names_this_checkout_and_its_command(provenance, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/somewhere/benchmarks/x.py", "--quick"])
    src = provenance.source()
    assert re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?", src["commit"])
    assert src["command"] == "python benchmarks/x.py --quick"
    recorded = {"source": {"commit": "abc1234", "command": "python benchmarks/x.py"}, "rows": []}
    assert provenance.source(recorded) == recorded["source"]


def test_the_paired_report_is_its_json_rendered(benchmarks_on_path):
    """``cpu_pipeline_paired.md`` is what ``cpu_paired.render`` renders from the JSON, Source lines and other
    modes' sections included
    (the passes' sources are recorded, so a new pass rewrites the report without losing them)."""
    import json
    from pathlib import Path

    paired = importlib.import_module("cpu_paired")
    results = Path(paired.RESULTS)
    data = json.loads((results / "cpu_pipeline_paired.json").read_text(encoding="utf-8"))
    want = paired.render(data)
    assert (results / "cpu_pipeline_paired.md").read_text(encoding="utf-8") == want
