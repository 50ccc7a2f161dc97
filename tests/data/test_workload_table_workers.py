"""Reading a workload JSONL with ``plan --jobs``: chunks decoded in worker
processes give the serial reader's table, and a bad record the same one-line error."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from entrain.core.errors import DataError
from entrain.core.workers import worker_processes
from entrain.data.workload_table import read_workload_table

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from planning_scale import write_workload  # noqa: E402


def _read(path, jobs: int):
    with worker_processes(jobs):
        return read_workload_table(str(path), chunk_lines=50)


def test_workers_read_the_serial_table(tmp_path):
    path = tmp_path / "w.jsonl"
    write_workload(path, 1000, seed=4)
    serial, pooled = _read(path, 1), _read(path, 2)
    assert list(pooled) == list(serial) and len(serial) == 1000
    for name in (
        "id_bytes",
        "id_offsets",
        "image_offsets",
        "heights",
        "widths",
        "text_tokens",
        "vit_patches",
    ):
        assert np.array_equal(getattr(pooled, name), getattr(serial, name)), name


def test_workers_name_the_same_bad_record(tmp_path):
    path = tmp_path / "w.jsonl"
    write_workload(path, 1000, seed=4)
    lines = path.read_text().splitlines(keepends=True)
    lines[876] = lines[876].replace('"text_tokens":', '"text_tokens":-')
    path.write_text("".join(lines))
    errors = []
    for jobs in (1, 2):
        with pytest.raises(DataError) as e:
            _read(path, jobs)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and ":877" in errors[0]
