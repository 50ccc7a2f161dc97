"""Workload JSONL / raw-work JSONL I/O and the ``--dataset`` resolver."""

from __future__ import annotations

import json

import pytest

from entrain.core.errors import ConfigError, DataError
from entrain.core.workload.samples import SampleMeta
from entrain.data.generators import generate_samples
from entrain.data.workload_io import (
    detect_format,
    load_workload,
    read_raw_work_jsonl,
    read_workload_jsonl,
    sample_works,
    write_workload_jsonl,
)


def _write(path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_round_trip(tmp_path):
    samples = generate_samples("chartqa", 50, seed=3) + [
        SampleMeta("multi", ((100, 200), (300, 28)), 7),
        SampleMeta("answered", ((100, 200),), 90, answer_tokens=60),
    ]
    path = str(tmp_path / "w.jsonl")
    write_workload_jsonl(path, samples)
    back = read_workload_jsonl(path)
    assert back == samples
    assert back[-1].answer_tokens == 60 and back[-2].answer_tokens is None
    assert [s.images for s in back] == [s.images for s in samples]
    assert detect_format(path) == "workload"


def test_raw_work_round_trip(tmp_path):
    path = _write(
        tmp_path / "r.jsonl",
        ['{"id": "a", "encoder": 3.5, "llm": 1}', "", '{"id": "b", "encoder": 0, "llm": 2.25}'],
    )
    assert detect_format(path) == "raw_work"
    works = read_raw_work_jsonl(path)
    assert [(w.id, w.encoder, w.llm, w.meta) for w in works] == [
        ("a", 3.5, 1.0, None),
        ("b", 0.0, 2.25, None),
    ]


GOOD = '{"id": "ok", "images": [[480, 640]], "text_tokens": 30}'


@pytest.mark.parametrize(
    ("bad_line", "field", "reason"),
    [
        ('{"id": "x", "images": [[480, 640]], "text_tokens": 30', None, "invalid JSON"),
        ('["x"]', None, "expected a JSON object"),
        ('{"images": [[480, 640]], "text_tokens": 30}', "id", "missing"),
        ('{"id": 5, "images": [[480, 640]], "text_tokens": 30}', "id", "non-empty string"),
        ('{"id": "x", "text_tokens": 30}', "images", "missing"),
        ('{"id": "x", "images": [480, 640], "text_tokens": 30}', "images", "[H, W]"),
        ('{"id": "x", "images": [[480, -640]], "text_tokens": 30}', "images", "positive"),
        ('{"id": "x", "images": [[480.5, 640]], "text_tokens": 30}', "images", "[H, W]"),
        ('{"id": "x", "images": [[10, 5000]], "text_tokens": 30}', "images", "aspect ratio"),
        ('{"id": "x", "images": [[480, 640]]}', "text_tokens", "missing"),
        ('{"id": "x", "images": [[480, 640]], "text_tokens": -1}', "text_tokens", ">= 0"),
        ('{"id": "x", "images": [[480, 640]], "text_tokens": "30"}', "text_tokens", "integer"),
        ('{"id": "x", "images": [], "text_tokens": 0}', "text_tokens", "no images and no text"),
        (
            '{"id": "x", "images": [], "text_tokens": 5, "answer_tokens": 6}',
            "answer_tokens",
            "0..text_tokens",
        ),
        ('{"id": "x", "images": [], "text_tokens": 5, "answer_tokens": 1.5}', "answer_tokens", "integer"),
        (
            '{"id": "ok", "images": [[480, 640]], "text_tokens": 30}',
            "id",
            "duplicate id 'ok' (first on line 1)",
        ),
    ],
)
def test_bad_workload_line_names_file_line_and_field(tmp_path, bad_line, field, reason):
    path = _write(tmp_path / "bad.jsonl", [GOOD, "", bad_line])
    with pytest.raises(DataError) as e:
        read_workload_jsonl(path)
    assert (e.value.path, e.value.record, e.value.field) == (path, 3, field)
    assert reason in e.value.reason
    assert str(e.value).startswith(f"{path}:3:")
    if field:
        assert f"field {field!r}" in str(e.value)


@pytest.mark.parametrize(
    ("bad_line", "field"),
    [
        ('{"id": "b", "llm": 1}', "encoder"),
        ('{"id": "b", "encoder": -1, "llm": 1}', "encoder"),
        ('{"id": "b", "encoder": 1, "llm": true}', "llm"),
        ('{"id": "b", "encoder": 1, "llm": "2"}', "llm"),
        ('{"id": "a", "encoder": 1, "llm": 2}', "id"),
    ],
)
def test_bad_raw_work_line(tmp_path, bad_line, field):
    path = _write(tmp_path / "raw.jsonl", ['{"id": "a", "encoder": 1, "llm": 2}', bad_line])
    with pytest.raises(DataError) as e:
        read_raw_work_jsonl(path)
    assert (e.value.record, e.value.field) == (2, field)


def test_unknown_first_record_format(tmp_path):
    path = _write(tmp_path / "odd.jsonl", ['{"id": "a", "pixels": 3}'])
    with pytest.raises(DataError, match="unknown record format"):
        detect_format(path)


def test_llava_input_is_detected(tmp_path):
    record = {"id": "1", "image": "a.jpg", "conversations": [{"from": "human", "value": "<image>\nhi"}]}
    jsonl = _write(tmp_path / "llava.jsonl", [json.dumps(record)])
    array = tmp_path / "llava.json"
    array.write_text(json.dumps([record], indent=1))
    for path in (jsonl, str(array)):
        assert detect_format(path) == "conversation"


def test_load_builtin_draws_consecutive_slices(cost):
    batches = list(load_workload("cocoqa", cost, global_batch=8, iterations=3, seed=2))
    assert [len(b) for b in batches] == [8, 8, 8]
    assert [w.id for w in batches[1]] == [f"cocoqa-2-{i}" for i in range(8, 16)]
    metas = generate_samples("cocoqa", 24, seed=2)
    flat = [w for b in batches for w in b]
    assert [w.meta for w in flat] == metas
    assert all(w == cost.sample_work(m) for w, m in zip(flat, metas))


def test_sample_works_equals_cost_model(cost):
    samples = generate_samples("skewed", 300, seed=0)
    assert sample_works(samples, cost) == [cost.sample_work(s) for s in samples]


def test_load_file_in_order_shuffled_and_short(tmp_path, cost):
    samples = generate_samples("llava150k", 20, seed=0)
    path = str(tmp_path / "w.jsonl")
    write_workload_jsonl(path, samples)
    batches = list(load_workload(path, cost, global_batch=5, iterations=4, seed=0))
    assert [w.id for b in batches for w in b] == [s.id for s in samples]
    shuffled = list(load_workload(path, cost, global_batch=5, iterations=4, seed=1, shuffle=True))
    ids = [w.id for b in shuffled for w in b]
    assert sorted(ids) == sorted(s.id for s in samples) and ids != [s.id for s in samples]
    again = list(load_workload(path, cost, global_batch=5, iterations=4, seed=1, shuffle=True))
    assert [w.id for b in again for w in b] == ids
    with pytest.raises(ConfigError) as e:
        load_workload(path, cost, global_batch=8, iterations=3, seed=0)
    msg = str(e.value)
    assert path in msg and "20" in msg and "24" in msg


def test_raw_work_file_is_used_as_given(tmp_path, cost):
    path = _write(tmp_path / "raw.jsonl", [f'{{"id": "s{i}", "encoder": {i}, "llm": 1.5}}' for i in range(6)])
    (batch,) = load_workload(path, cost, global_batch=6, iterations=1, seed=0)
    assert [(w.encoder, w.llm) for w in batch] == [(float(i), 1.5) for i in range(6)]


def test_unknown_name_is_a_config_error(cost):
    with pytest.raises(ConfigError, match="neither a built-in dataset"):
        load_workload("no-such-dataset", cost, global_batch=4, iterations=1, seed=0)


def test_tensor_parallel_work_comes_from_the_cost_model():
    from entrain.core.costs.presets import build_cost_model

    cost = build_cost_model("qwen25vl-llama3-1b", "a40-paper")
    (batch,) = load_workload("synthchartnet", cost, global_batch=16, iterations=1, seed=0, tp=2)
    assert all(w == cost.sample_work(w.meta, 2, 1) for w in batch)
    assert all(w != cost.sample_work(w.meta) for w in batch)
