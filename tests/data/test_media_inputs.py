"""Every input kind a record can carry is trained or named as a bad record, never dropped: entrain trains
images, and a LLaVA record's audio and video files (a JSON/JSONL record's paths; a shard's fields,
members, bytes or paths: tests/data/test_shard_media.py) for a family that reads them, so a missing or
undecodable one, a video or audio column of a FineVision-style table (no placeholders to place it), a
``<video>``/``<audio>`` placeholder without its field, and a field no reader reads that holds a media
file's path or bytes are bad records for every reader, for ``entrain data check`` (``check_dataset``),
for ``entrain train``'s screening (``screen_dataset``) and for ``data stats`` (``read_samples``)."""

from __future__ import annotations

import io
import json
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from entrain.core.errors import DataError
from entrain.data import llava
from entrain.data.check import BadSamplesError, check_dataset, screen_dataset
from entrain.data.shards import iter_sharded
from entrain.data.workload_io import read_samples

ASK = {"from": "human", "value": "What happens?"}
ANSWER = {"from": "gpt", "value": "A cat jumps."}


def _record(rid: str, question: str = "What happens?", **fields) -> dict:
    return {"id": rid, **fields, "conversations": [{"from": "human", "value": question}, ANSWER]}


UNSUPPORTED = "inputs are not supported in a FineVision-style table"

BAD_RECORDS = {
    # a record's video files are read too (a video family trains them): a missing one is named
    "video field": (_record("v", "<video>\nWhat?", video="clip.mp4"), "video", "clip.mp4: missing"),
    "videos list": (
        _record("vs", "<video><video>\nWhat?", videos=["a.mp4", "b.mp4"]),
        "videos[1]",
        "b.mp4: missing",
    ),
    # a record's audio files are read (an audio family trains them): a missing one is named
    "audio field": (_record("a", "<audio>\nWho?", audio="talk.wav"), "audio", "talk.wav: missing"),
    "audios list": (_record("as", "<audio>\nWho?", audios=["talk.wav"]), "audios[0]", "talk.wav: missing"),
    "video placeholder without a field": (
        _record("p", "<video>\nWhat?"),
        "conversations",
        "1 <video> placeholder(s) but 0 video input(s)",
    ),
    "audio placeholder without a field": (
        _record("q", "<audio>\nWho?"),
        "conversations",
        "1 <audio> placeholder(s) but 0 audio input(s)",
    ),
    "video field without a placeholder": (
        _record("n", video="clip.mp4"),
        "conversations",
        "0 <video> placeholder(s) but 1 video input(s)",
    ),
    "unknown key with a video path": (
        _record("u", frames="clips/clip.MP4"),
        "frames",
        "'clips/clip.MP4' looks like a video file but 'frames' is not a field entrain reads",
    ),
    "unknown key with an image path": (
        _record("i", picture=["pics/x.jpg"]),
        "picture",
        "'pics/x.jpg' looks like an image file but 'picture' is not a field entrain reads",
    ),
    "video content part": (
        {
            "id": "m",
            "video": "clip.mp4",
            "messages": [
                {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]},
                {"role": "assistant", "content": "A cat."},
            ],
        },
        "video",
        "clip.mp4: missing",
    ),
}
MISSING_VIDEO = "clip.mp4: missing"


def _problems(item) -> list[tuple[str, str]]:
    assert item.record is None, item
    return item.problems


@pytest.mark.parametrize("name", list(BAD_RECORDS))
@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_the_llava_reader_names_every_unsupported_input(tmp_path, name, fmt):
    record, field, reason = BAD_RECORDS[name]
    good = _record(
        "ok", source="coco", note="a plain string", format="mp4"
    )  # extra keys without media paths stay good
    path = tmp_path / f"d.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps([good, record]))
    else:
        path.write_text("\n".join(json.dumps(r) for r in (good, record)) + "\n")
    ok, bad = llava.iter_parsed(path)
    assert ok.record is not None and ok.problems == []
    assert any(f == field and reason in why for f, why in _problems(bad)), bad.problems
    assert (bad.index, bad.id) == (1, record["id"])


def _llava_parquet(path, rows: list[dict]) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_a_parquet_video_column_is_read_so_a_missing_file_is_named(tmp_path):
    rows = [
        {"id": "a", "conversations": [ASK, ANSWER], "video": None},
        {
            "id": "b",
            "conversations": [{"from": "human", "value": "<video>\nWhat?"}, ANSWER],
            "video": "c.mp4",
        },
    ]
    _llava_parquet(tmp_path / "d.parquet", rows)
    ok, bad = llava.iter_parsed(tmp_path / "d.parquet")
    assert ok.record is not None
    assert _problems(bad) == [("video", "c.mp4: missing")]


def test_a_parquet_column_no_reader_reads_holding_media_paths_makes_its_rows_bad(tmp_path):
    rows = [
        {"id": "a", "conversations": [ASK, ANSWER], "frames": None, "source": "coco"},
        {"id": "b", "conversations": [ASK, ANSWER], "frames": ["clips/b.mp4"], "source": "coco"},
    ]
    _llava_parquet(tmp_path / "d.parquet", rows)
    ok, bad = llava.iter_parsed(tmp_path / "d.parquet")
    assert ok.record is not None
    assert any(f == "frames" and "'clips/b.mp4' looks like a video file" in why for f, why in _problems(bad))


def test_an_arrow_video_column_is_read_so_a_missing_file_is_named(tmp_path):
    table = pa.Table.from_pylist([{"id": "v", "conversations": [ASK, ANSWER], "video": "c.mp4"}])
    folder = tmp_path / "hf"
    folder.mkdir()
    with pa.ipc.new_stream(folder / "data-00000-of-00001.arrow", table.schema) as writer:
        writer.write_table(table)
    (folder / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    (folder / "dataset_info.json").write_text("{}")
    (bad,) = iter_sharded(folder)
    assert ("video", "c.mp4: missing") in _problems(bad)


def test_a_finevision_audio_column_makes_its_rows_bad(tmp_path):
    rows = [{"id": "a", "images": [], "texts": [{"user": "Who?", "assistant": "Ann."}], "audio": b"RIFF...."}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "f.parquet")
    (bad,) = llava.iter_parsed(tmp_path / "f.parquet")
    assert any(f == "audio" and UNSUPPORTED in why for f, why in _problems(bad)), bad.problems


def _tar(path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize(("ext", "field"), [("mp4", "videos"), ("0.wav", "audios")])
def test_a_webdataset_video_or_audio_member_is_read_so_garbage_is_named(tmp_path, ext, field):
    meta = json.dumps({"conversations": [ASK, ANSWER]}).encode()
    folder = tmp_path / "wds"
    folder.mkdir()
    _tar(folder / "shard-00000.tar", {"s0.json": meta, "s1.json": meta, f"s1.{ext}": b"\x00" * 16})
    ok, bad = iter_sharded(folder)
    assert ok.record is not None
    assert any(f == f"{field}[0]" and f"(s1.{ext}, bytes " in why for f, why in _problems(bad)), bad.problems


@pytest.fixture
def video_dataset(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([_record("ok"), BAD_RECORDS["video field"][0], _record("ok2")]))
    return path


def test_data_check_counts_the_video_record_bad(video_dataset):
    report = check_dataset(video_dataset)
    assert (report.records, report.bad) == (3, 1)
    (finding,) = report.errors
    assert (finding.index, finding.field) == (1, "video") and MISSING_VIDEO in finding.reason


def test_train_screening_stops_at_the_video_record_or_skips_it(video_dataset, tmp_path):
    with pytest.raises(BadSamplesError, match="1 of 3 record"):
        screen_dataset(video_dataset)
    screened = screen_dataset(video_dataset, on_bad="skip", out_dir=tmp_path / "run")
    assert [r.id for r in screened.records] == ["ok", "ok2"]
    (skipped,) = [json.loads(line) for line in (tmp_path / "run" / "skipped.jsonl").read_text().splitlines()]
    assert skipped["id"] == "v" and MISSING_VIDEO in json.dumps(skipped)


def test_data_stats_reading_stops_at_the_video_record(video_dataset):
    with pytest.raises(DataError, match=r"d\.json:1 \(id v\).*'video': clip\.mp4: missing"):
        read_samples(str(video_dataset))


def test_a_metadata_cache_from_before_the_media_check_is_not_reused(video_dataset, monkeypatch):
    """``data stats`` reads the metadata cached next to the data: one written when a video record still
    passed as text (cache version 4, no media check) is not reused, so the record is named bad."""
    from entrain.data import conversation, metadata_cache

    with monkeypatch.context() as old:
        old.setattr(metadata_cache, "_VERSION", 4)
        old.setattr(conversation, "media_problems", lambda *args: [])
        old.setattr(conversation, "_video_list", lambda *args: ((), "video", False))  # kept no video then
        assert [s.id for s in read_samples(str(video_dataset))] == ["ok", "v", "ok2"]
    assert list((video_dataset.parent / metadata_cache.CACHE_DIRNAME).iterdir())
    with pytest.raises(DataError, match=MISSING_VIDEO):
        read_samples(str(video_dataset))


WAV = b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00"
MP4 = b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00"
FILE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
"""The ``datasets`` Image / Audio / Video features' storage."""


def _shard(folder, fmt: str, column: str, value, kind=FILE):
    """A one-shard dataset of two records, the second holding ``value`` in ``column``."""
    folder.mkdir()
    if fmt == "webdataset":
        meta = json.dumps({"conversations": [ASK, ANSWER]}).encode()
        _tar(folder / "shard-00000.tar", {"s0.json": meta, "s1.json": meta, f"s1.{column}": value})
        return folder / "shard-00000.tar"
    if fmt == "finevision":
        text = pa.list_(pa.struct([("user", pa.string()), ("assistant", pa.string())]))
        schema = pa.schema([("id", pa.string()), ("images", pa.list_(FILE)), ("texts", text), (column, kind)])
        texts = [{"user": "What happens?", "assistant": "A cat jumps."}]
        rows = [{"id": f"s{i}", "images": [], "texts": texts, column: v} for i, v in enumerate((None, value))]
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "part-00000.parquet")
        return folder / "part-00000.parquet"
    turn = pa.struct([("from", pa.string()), ("value", pa.string())])
    schema = pa.schema([("id", pa.string()), ("conversations", pa.list_(turn)), (column, kind)])
    rows = [{"id": "s0", "conversations": [ASK, ANSWER], column: None},
            {"id": "s1", "conversations": [ASK, ANSWER], column: value}]  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=schema)
    if fmt == "arrow":  # a datasets save_to_disk folder
        with pa.ipc.new_stream(folder / "data-00000-of-00001.arrow", table.schema) as writer:
            writer.write_table(table)
        (folder / "state.json").write_text(
            json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
        )
        (folder / "dataset_info.json").write_text("{}")
        return folder / "data-00000-of-00001.arrow"
    pq.write_table(table, folder / "part-00000.parquet")
    return folder / "part-00000.parquet"


SHARD_MEDIA = {
    # a FineVision-style table's audio or video: refused (that schema has no placeholders to place it)
    "finevision audio column": ("finevision", "audio", WAV, pa.binary(), "audio", UNSUPPORTED),
    "finevision videos column": ("finevision", "videos", [{"bytes": MP4, "path": None}], pa.list_(FILE), "videos",
                                 UNSUPPORTED),
    # a column no reader reads holding a media file: named, not dropped (a LLaVA-fields shard's audio and
    # video fields are read: tests/data/test_shard_media.py)
    "parquet unknown audio column": ("parquet", "speech", {"bytes": WAV, "path": None}, FILE, "speech",
                                     "holds an audio file (its bytes) but 'speech' is not a field entrain reads"),
    "parquet unknown binary video column": ("parquet", "clip", MP4, pa.binary(), "clip",
                                            "holds a video file (its bytes) but 'clip' is not a field"),
    "arrow unknown video column": ("arrow", "clip", {"bytes": MP4, "path": None}, FILE, "clip",
                                   "holds a video file (its bytes) but 'clip' is not a field"),
    "finevision unknown audio column": ("finevision", "speech", WAV, pa.binary(), "speech",
                                        "holds an audio file (its bytes) but 'speech' is not a field"),
    "parquet unknown audio path": ("parquet", "question_audio", {"bytes": None, "path": "q.flac"}, FILE,
                                   "question_audio", "holds an audio file (its path) but 'question_audio'"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SHARD_MEDIA))
def test_a_shards_unplaceable_or_unread_media_is_named_in_one_line(tmp_path, name):
    """Audio or video in a FineVision-style shard, or in a column no reader reads (bytes, the ``datasets``
    storage, a path), makes its record bad in exactly one line naming the shard,
    the record and the field; the record beside it stays good. ``data check`` reports that line."""
    fmt, column, value, kind, field, why = SHARD_MEDIA[name]
    shard = _shard(tmp_path / "shards", fmt, column, value, kind)
    ok, bad = iter_sharded(tmp_path / "shards")
    assert ok.record is not None and bad.record is None
    ((got_field, got_why),) = bad.problems
    assert (bad.file, bad.id, got_field) == (str(shard), "s1", field) and why in got_why, bad.problems
    report = check_dataset(tmp_path / "shards")
    assert report.bad == 1
    (line,) = report.errors
    assert (line.file, line.id, line.field) == (str(shard), "s1", field)
