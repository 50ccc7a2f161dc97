"""Audio clips and videos in a sharded dataset are read and trained as a LLaVA JSON record's files are:
stored in the shard (WebDataset ``.wav`` / ``.mp4`` members, Parquet / Arrow bytes in the ``datasets``
``{bytes, path}`` storage) or named by a path relative to the dataset folder. ``data stats`` reports
the same tokens as for the same records with loose files, the records training keeps hold no bytes and
give the same log-mel features and video pixels, and ``data check`` names a bad clip or video in a
shard by shard, record index, field and the file's own name."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.io import wavfile

from entrain.cli.main import main
from entrain.core.workload.samples import DEFAULT_VISION
from entrain.data.check import screen_dataset
from entrain.data.records import ImageRef
from entrain.runtime.record_source import RecordSource

from .video_files import write_video


def _turns(question: str) -> list[dict]:
    return [{"from": "human", "value": question}, {"from": "gpt", "value": "A cat jumps over it."}]


RECORDS = [
    {"id": "one", "audio": "talk.wav", "conversations": _turns("<audio>\nWho speaks?")},
    {"id": "two", "audios": ["talk.wav", "slow.wav"], "conversations": _turns("<audio> then <audio>: one voice?")},
    {"id": "track", "video": "clip.mp4", "use_audio_in_video": True, "conversations": _turns("<video>\nWhat is heard?")},
    {"id": "mute", "videos": ["clip.mp4"], "conversations": _turns("<video>\nWhat moves?")},
]  # fmt: skip
"""Clips (one at 8 kHz: resampled to 16 kHz), a video with its audio track fed, and one without."""


def _files(record: dict, kind: str) -> list[str]:
    value = record.get(kind, record.get(f"{kind}s"))
    return [] if value is None else [value] if isinstance(value, str) else list(value)


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("media")
    rng = np.random.default_rng(0)
    wavfile.write(folder / "talk.wav", 16_000, (3000 * rng.normal(size=8000)).astype(np.int16))
    wavfile.write(folder / "slow.wav", 8_000, (3000 * rng.normal(size=2900)).astype(np.int16))
    write_video(folder / "clip.mp4", frames=8, fps=4, audio_seconds=1.3)
    return {name: (folder / name).read_bytes() for name in ("talk.wav", "slow.wav", "clip.mp4")}


def _loose(folder: Path, media: dict[str, bytes], records=RECORDS) -> Path:
    folder.mkdir()
    for name, data in media.items():
        (folder / name).write_bytes(data)
    (folder / "data.json").write_text(json.dumps(records))
    return folder / "data.json"


def _tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def _webdataset(folder: Path, media: dict[str, bytes], records=RECORDS) -> Path:
    """Each record's clips and videos as its sample's members (``key.wav``, ``key.0.wav``, ...)."""
    folder.mkdir()
    members = []
    for r in records:
        meta = {k: v for k, v in r.items() if k not in ("audio", "audios", "video", "videos")}
        members.append((f"{r['id']}.json", json.dumps(meta).encode()))
        for kind in ("audio", "video"):
            names = _files(r, kind)
            for i, name in enumerate(names):
                index = f".{i}" if len(names) > 1 else ""
                members.append((f"{r['id']}{index}.{name.rsplit('.', 1)[1]}", media[name]))
    _tar(folder / "shard-00000.tar", members)
    return folder


FILE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
TURN = pa.struct([("from", pa.string()), ("value", pa.string())])


def _table(media: dict[str, bytes] | None, records=RECORDS) -> pa.Table:
    """LLaVA fields with ``audios`` / ``videos`` as the ``datasets`` storage (``media``: the bytes) or
    as paths (``media`` None)."""
    item = FILE if media is not None else pa.string()
    schema = pa.schema([("id", pa.string()), ("conversations", pa.list_(TURN)), ("audios", pa.list_(item)),
                        ("videos", pa.list_(item)), ("use_audio_in_video", pa.bool_())])  # fmt: skip

    def files(r: dict, kind: str):
        names = _files(r, kind)
        if not names:
            return None
        return [{"bytes": media[n], "path": n} for n in names] if media is not None else names

    rows = [{"id": r["id"], "conversations": r["conversations"], "audios": files(r, "audio"),
             "videos": files(r, "video"), "use_audio_in_video": r.get("use_audio_in_video")} for r in records]  # fmt: skip
    return pa.Table.from_pylist(rows, schema=schema)


def _parquet(folder: Path, media: dict[str, bytes], records=RECORDS) -> Path:
    folder.mkdir()
    pq.write_table(_table(media, records), folder / "train-00000.parquet", row_group_size=2)
    return folder


def _arrow(folder: Path, media: dict[str, bytes], records=RECORDS) -> Path:
    """A ``datasets`` ``save_to_disk`` folder (arrow IPC stream + ``state.json``)."""
    folder.mkdir()
    table = _table(media, records)
    with pa.ipc.new_stream(folder / "data-00000-of-00001.arrow", table.schema) as writer:
        for batch in table.to_batches(max_chunksize=2):
            writer.write_batch(batch)
    (folder / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    (folder / "dataset_info.json").write_text("{}")
    return folder


def _parquet_paths(folder: Path, media: dict[str, bytes], records=RECORDS) -> Path:
    """Parquet rows naming their files by paths relative to the dataset folder, which holds them."""
    folder.mkdir()
    for name, data in media.items():
        (folder / name).write_bytes(data)
    pq.write_table(_table(None, records), folder / "train-00000.parquet")
    return folder


SHARDED = {"webdataset": _webdataset, "parquet": _parquet, "arrow": _arrow, "parquet paths": _parquet_paths}


def _stats(capsys, dataset: Path) -> dict:
    assert main(["data", "stats", "--dataset", str(dataset), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    stats.pop("dataset")
    return stats


@pytest.mark.parametrize("fmt", list(SHARDED))
def test_stats_of_a_shards_audio_and_video_equal_the_loose_files(tmp_path, media, fmt, capsys):
    loose = _stats(capsys, _loose(tmp_path / "loose", media))
    assert loose["audio_tokens"]["mean"] > 0 and loose["video_tokens"]["mean"] > 0
    assert _stats(capsys, SHARDED[fmt](tmp_path / "shards", media)) == loose


@pytest.mark.parametrize("fmt", ["webdataset", "parquet", "arrow"])
def test_kept_shard_records_give_the_loose_files_features_and_pixels(tmp_path, media, fmt):
    """What training reads (``RecordSource``: the clips' and tracks' log-mel features, the videos'
    pixels) is the loose files', read again by location from records that hold no bytes."""
    loose = screen_dataset(_loose(tmp_path / "loose", media))
    shards = screen_dataset(SHARDED[fmt](tmp_path / "shards", media))
    assert [m.id for m in shards.samples] == [r["id"] for r in RECORDS]
    assert [(m.audio, m.video) for m in shards.samples] == [(m.audio, m.video) for m in loose.samples]
    kept = [f for r in shards.records for f in (*r.audio, *r.video)]
    assert len(kept) == 5 and all(isinstance(f, ImageRef) and f.data is None for f in kept)
    ours, theirs = RecordSource("", records=shards.records), RecordSource("", records=loose.records)
    for rid in ("one", "two", "track"):
        np.testing.assert_array_equal(ours.audio_features(rid, 128), theirs.audio_features(rid, 128))
    for rid in ("track", "mute"):
        for got, want in zip(
            ours.pixels(rid, DEFAULT_VISION), theirs.pixels(rid, DEFAULT_VISION), strict=True
        ):
            np.testing.assert_array_equal(got, want)


def _check_lines(capsys, dataset: Path) -> list[str]:
    assert main(["data", "check", str(dataset)]) == 1
    return capsys.readouterr().out.splitlines()


def test_data_check_names_a_bad_clip_or_video_in_a_shard(tmp_path, media, capsys):
    """A truncated or empty clip and a cut video stored in a tar shard, and a missing file a Parquet
    shard names: each line names the shard, the record's index, the field and the file."""
    wav, mp4 = media["talk.wav"], media["clip.mp4"]
    cut = {"talk.wav": wav[: len(wav) // 2], "slow.wav": b"", "clip.mp4": mp4[: len(mp4) // 2]}
    folder = _webdataset(tmp_path / "wds", cut, RECORDS[:3])
    shard = folder / "shard-00000.tar"
    lines = _check_lines(capsys, folder)
    for index, rid, field, member, reason in [
        (0, "one", "audios[0]", "one.wav", "truncated"),
        (1, "two", "audios[0]", "two.0.wav", "truncated"),
        (1, "two", "audios[1]", "two.1.wav", "empty"),
        (2, "track", "videos[0]", "track.mp4", "undecodable"),
    ]:
        line = next(x for x in lines if f"record {index} id '{rid}': {field}: " in x)
        assert (
            line.startswith(f"{shard}: ") and f"{shard} ({member}, bytes " in line and f"): {reason}" in line
        )
    missing = [
        {"id": "one", "audios": ["talk.wav", "gone.wav"], "conversations": _turns("<audio><audio>\nWho?")}
    ]
    folder = _parquet_paths(tmp_path / "pq", {"talk.wav": wav}, missing)
    (line,) = [x for x in _check_lines(capsys, folder) if "[error]" in x]
    assert (
        line == f"{folder / 'train-00000.parquet'}: record 0 id 'one': audios[1]: gone.wav: missing [error]"
    )


def test_a_tiny_omni_thinker_renders_shard_records_as_the_loose_ones(tmp_path, media):
    """Training's renderer (``SampleRenderer`` over screened records, a tiny Qwen2.5-Omni thinker's
    family) gives a tar shard's records the ids, labels, log-mel features and video patches it gives
    the same records with loose files."""
    import torch

    from entrain.models.families.base import ModelSource
    from entrain.models.families.registry import family_of_source
    from entrain.runtime.data import SampleRenderer
    from tests.models.qwen2_5_omni_tiny import save_whole

    source = ModelSource(
        model_path=str(save_whole(tmp_path / "tiny", text_layers=1, vision_depth=1, audio_layers=1))
    )
    family = family_of_source(source)
    cfg, _ = family.runtime_config(source)
    rule = family.image_rule(cfg.shape, None, None)

    def renderer(path: Path) -> SampleRenderer:
        screened = screen_dataset(path, vision=rule)
        metas = {m.id: m for m in screened.samples}
        return SampleRenderer(cfg, metas, source=RecordSource(str(path), records=screened.records))

    ours = renderer(_webdataset(tmp_path / "shards", media))
    theirs = renderer(_loose(tmp_path / "loose", media))
    for rid in [r["id"] for r in RECORDS]:
        got, want = ours.sample(rid), theirs.sample(rid)
        for name in ("input_ids", "label_positions", "targets"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (rid, name)
        assert torch.equal(ours.audio_features(rid), theirs.audio_features(rid))
        if got.video_items:
            assert torch.equal(ours.patches(rid), theirs.patches(rid))
    assert ours.sample("track").audio_tokens > 0 and ours.sample("mute").video_items
