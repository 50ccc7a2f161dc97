"""The streamed workload reader (``read_workload_table``): the same samples and the same one-line
errors as ``read_workload_jsonl``, with memory bounded by a chunk, not by the file."""

import json
import tracemalloc

import numpy as np
import pytest

from entrain.core.errors import DataError
from entrain.data.workload_io import read_workload_jsonl
from entrain.data.workload_table import read_workload_table


def write_lines(path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(n):
            images = rng.integers(224, 1025, (int(rng.integers(0, 5)), 2)).tolist()
            rec = {"id": f"s{i}", "images": images, "text_tokens": int(rng.integers(20, 2001))}
            if i % 7 == 0:
                rec["answer_tokens"] = int(rng.integers(0, rec["text_tokens"] + 1))
            f.write(json.dumps(rec) + ("\n\n" if i % 50 == 0 else "\n"))


@pytest.mark.parametrize("chunk_lines", [1, 7, 4096])
def test_same_samples_as_the_list_reader(tmp_path, chunk_lines):
    path = tmp_path / "w.jsonl"
    write_lines(path, 600)
    table = read_workload_table(path, chunk_lines=chunk_lines)
    assert list(table) == read_workload_jsonl(path)


GOOD = '{"id": "a", "images": [[300, 400]], "text_tokens": 10}'
BAD_RECORDS = {
    "json": "{not json",
    "object": "[1, 2]",
    "missing text": '{"id": "x", "images": []}',
    "side": '{"id": "x", "images": [[300, "4"]], "text_tokens": 10}',
    "aspect": '{"id": "x", "images": [[10, 5000]], "text_tokens": 10}',
    "empty": '{"id": "x", "images": [], "text_tokens": 0}',
    "answer": '{"id": "x", "images": [], "text_tokens": 3, "answer_tokens": 4}',
    "bool": '{"id": "x", "images": [[true, 3]], "text_tokens": 3}',
    "id": '{"id": "", "images": [], "text_tokens": 3}',
    "duplicate": GOOD,
}


@pytest.mark.parametrize("chunk_lines", [2, 4096])
@pytest.mark.parametrize("bad", sorted(BAD_RECORDS))
def test_same_error_as_the_list_reader(tmp_path, bad, chunk_lines):
    path = tmp_path / "w.jsonl"
    lines = (
        [GOOD]
        + [GOOD.replace('"a"', f'"g{i}"') for i in range(5)]
        + [BAD_RECORDS[bad], GOOD.replace('"a"', '"z"')]
    )
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as want:
        read_workload_jsonl(path)
    with pytest.raises(DataError) as got:
        read_workload_table(path, chunk_lines=chunk_lines)
    assert str(got.value) == str(want.value)


def test_duplicate_before_a_bad_record_is_reported_first(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join([GOOD, GOOD.replace('"a"', '"b"'), GOOD, "{bad"]) + "\n")
    with pytest.raises(DataError) as got:
        read_workload_table(path, chunk_lines=4096)
    assert str(got.value) == f"{path}:3: field 'id': duplicate id 'a' (first on line 1)"


def test_truncated_last_line(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(GOOD + "\n" + GOOD.replace('"a"', '"b"')[:20])
    with pytest.raises(DataError) as want:
        read_workload_jsonl(path)
    with pytest.raises(DataError) as got:
        read_workload_table(path)
    assert str(got.value) == str(want.value) and "cannot be read to its end (1 record(s)" in str(got.value)


def test_reading_is_streamed(tmp_path):
    """No Python object kept per record: the table's arrays take under 160 bytes a sample, and the
    reader's peak allocation on 20,000 records in chunks of 256 stays within the table plus a
    chunk's worth (a list of SampleMeta or of parsed dicts would take over 5 MB here)."""
    path = tmp_path / "w.jsonl"
    n = 20_000
    write_lines(path, n)
    tracemalloc.start()
    try:
        table = read_workload_table(path, chunk_lines=256)
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(table) == n
    assert table.nbytes / n < 160
    assert peak_bytes < 3 * table.nbytes + 1_000_000, (peak_bytes, table.nbytes)
