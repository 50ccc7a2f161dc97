"""Sharded ``--dataset`` folders: Parquet shards, WebDataset tar shards and
a Hugging Face ``save_to_disk`` folder through ``data check``, ``data stats``, ``plan``; bad records
named by shard and index; parallel scanning equal to serial and in shard order; the per-shard
metadata cache; images read back by location (what training's pixels use)."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
import time
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from entrain.cli.main import main
from entrain.core.errors import ConfigError, DataError
from entrain.data import llava
from entrain.data.check import check_dataset
from entrain.data.llava import iter_parsed, read_metadata
from entrain.data.processing import load_image
from entrain.data.shards import dataset_shards, map_shards, scan_workers
from tests.data.shard_writers import FORMATS, dataset, image_bytes, records, write, write_hf


@pytest.fixture
def no_other_threads(monkeypatch):
    """What these tests check must not depend on a thread another test left running (with one alive,
    ``scan_workers`` scans in this process: ``test_a_live_thread_keeps_the_scan_in_this_process``)."""
    from entrain.data import shards

    monkeypatch.setattr(shards, "threads_running", lambda: False)


def _schema(name: str) -> dict:
    return json.loads(resources.files("entrain").joinpath(f"schemas/{name}.json").read_text())


def _run_json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_through_check_stats_and_plan(fmt, tmp_path, capsys):
    folder = dataset(fmt, tmp_path / fmt)
    report = _run_json(capsys, ["data", "check", str(folder), "--no-processor"])
    jsonschema.validate(report, _schema("data_check"))
    assert (report["records"], report["bad"], report["findings"]) == (8, 0, [])
    stats = _run_json(capsys, ["data", "stats", "--dataset", str(folder), "--model", "tiny"])
    jsonschema.validate(stats, _schema("data_stats"))
    assert stats["num_samples"] == 8 and stats["image_tokens"]["p50"] > 0
    argv = ["plan", "--dataset", str(folder), "--model", "tiny", "--gpus", "2", "--global-batch", "4"]
    plan = _run_json(capsys, [*argv, "--microbatch-size", "1", "--iterations", "2"])
    jsonschema.validate(plan, _schema("plan"))
    assert plan["predicted_iteration_time_ms"] > 0
    ids = [r.id for r in (item.record for item in iter_parsed(folder))]
    assert ids == [f"s{k}-{i}" for k, n in enumerate((3, 2, 3)) for i in range(n)]  # shard order


def _with_bad_record(fmt: str, folder: Path) -> tuple[Path, str]:
    """Shards 0..2 where record 1 of shard 1 has no assistant turn; (folder, the bad shard's name)."""
    shards = [records(k, n) for k, n in enumerate((3, 2, 3))]
    shards[1][1]["conversations"] = shards[1][1]["conversations"][:1]
    write(fmt, folder, shards)
    return folder, dataset_shards(folder)[1][0].name


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_bad_record_is_named_by_shard_and_index(fmt, tmp_path, capsys, no_other_threads):
    folder, shard = _with_bad_record(fmt, tmp_path / fmt)
    report = check_dataset(folder, processor=False, workers=2)
    (finding,) = report.errors
    assert (Path(finding.file).name, finding.index, finding.id, finding.field) == (
        shard,
        1,
        "s1-1",
        "conversations",
    )
    assert main(["data", "check", str(folder), "--no-processor"]) == 1
    assert f"{shard}: record 1 id 's1-1': conversations: no assistant turn" in capsys.readouterr().out
    with pytest.raises(DataError) as err:
        read_metadata(folder, use_cache=False, workers=2)  # raised in a worker, re-raised here
    assert f"{shard}:#1 (id s1-1): field 'conversations': no assistant turn" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_tar_sample_without_json_and_a_cut_shard_are_named(tmp_path):
    folder = dataset("webdataset", tmp_path / "wds", sizes=(2, 2))
    first, second = (p for p, _ in dataset_shards(folder))
    with tarfile.open(first, "a") as tf:  # a sample with only an image: no LLaVA fields
        info = tarfile.TarInfo("orphan.png")
        data = image_bytes(0)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    second.write_bytes(second.read_bytes()[:1500])  # cut inside its first sample's image
    report = check_dataset(folder, processor=False, workers=1)
    missing, cut = report.errors
    assert (Path(missing.file).name, missing.index, missing.field) == (first.name, 2, "json")
    assert "sample 'orphan' has no .json member (its members: .png)" in missing.reason
    assert (Path(cut.file).name, cut.field, report.complete) == (second.name, "tar", False)


def test_duplicate_ids_across_shards_and_parallel_equals_serial(tmp_path, no_other_threads):
    shards = [records(k, n) for k, n in enumerate((3, 2, 3))]
    shards[2][0]["id"] = "s0-1"  # the id of shard 0's record 1
    shards[1][1]["conversations"] = shards[1][1]["conversations"][:1]
    folder = write("parquet", tmp_path / "pq", shards)
    serial = check_dataset(folder, processor=False, workers=1).to_json()
    assert check_dataset(folder, processor=False, workers=3).to_json() == serial
    dup = [f for f in serial["findings"] if f["field"] == "id"]
    assert [(Path(f["file"]).name, f["index"]) for f in dup] == [("train-00002.parquet", 0)]
    assert "first used by record 1 of " in dup[0]["reason"] and "train-00000.parquet" in dup[0]["reason"]
    good = dataset("webdataset", tmp_path / "wds", sizes=(3, 1, 2, 2))
    assert read_metadata(good, use_cache=False, workers=1) == read_metadata(good, use_cache=False, workers=3)


def _slow_square(x: int) -> tuple[int, int]:
    time.sleep(0.05 * (3 - x))  # the first shards finish last
    return x * x, os.getpid()


def test_a_live_thread_keeps_the_scan_in_this_process():
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert scan_workers(4, requested=2) == 1
        assert {pid for _, pid in map_shards(_slow_square, [0, 1], workers=2)} == {os.getpid()}
    finally:
        stop.set()
        t.join()


def test_map_shards_runs_in_worker_processes_and_keeps_shard_order(no_other_threads):
    out = list(map_shards(_slow_square, [0, 1, 2, 3], workers=2))
    assert [r for r, _ in out] == [0, 1, 4, 9]
    assert os.getpid() not in {pid for _, pid in out}
    assert {pid for _, pid in map_shards(_slow_square, [3], workers=2)} == {os.getpid()}  # one shard: here


def test_scan_workers_share_the_cpus_among_the_ranks_of_a_node(monkeypatch, no_other_threads):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert [scan_workers(n) for n in (1, 3, 20)] == [1, 3, 8]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert [scan_workers(20), scan_workers(20, requested=5)] == [4, 5]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert scan_workers(20) == 1


def test_metadata_is_cached_per_shard(tmp_path, monkeypatch, no_other_threads):
    folder = dataset("hf", tmp_path / "hf")
    first = read_metadata(folder, workers=2)
    assert [m.id for m in first] == [f"s{k}-{i}" for k, n in enumerate((3, 2, 3)) for i in range(n)]
    real = llava.iter_records
    monkeypatch.setattr(llava, "iter_records", lambda *a, **k: pytest.fail("a cached shard was read again"))
    assert read_metadata(folder, workers=2) == first  # every shard from its cache
    shard = dataset_shards(folder)[1][0]
    os.utime(shard, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched: only this shard is read again
    seen = []
    monkeypatch.setattr(
        llava, "iter_records", lambda path, root: seen.append(Path(path).name) or real(path, root)
    )
    assert read_metadata(folder, workers=1) == first and seen == [shard.name]


@pytest.mark.parametrize("fmt", FORMATS)
def test_kept_records_read_their_images_by_location(fmt, tmp_path):
    folder = dataset(fmt, tmp_path / fmt, sizes=(3, 3))
    wanted = [r["image_bytes"] for k in range(2) for r in records(k, 3)]
    kept = [item.record.light() for item in iter_parsed(folder)]
    assert all(ref.data is None for r in kept for ref in r.images)  # no image bytes held
    assert [r.images[0].read_bytes() for r in kept] == wanted
    assert load_image(kept[-2].images[0]).size == (28 + 14 * (11 % 3), 28)  # record 1 of shard 1: image 11


def test_folder_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["data", "stats", "--dataset", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no .parquet or .tar shards and no Hugging Face save_to_disk dataset" in err and "\n" not in err
    write_hf(tmp_path / "dd" / "train", [records(0, 2)])
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    with pytest.raises(ConfigError, match="a Hugging Face DatasetDict; pass one split's folder .*dd/train"):
        dataset_shards(tmp_path / "dd")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_progress_bar_on_a_terminal_and_none_under_json(tmp_path, monkeypatch, capsys):
    from entrain.data import shards

    folder = dataset("webdataset", tmp_path / "wds", sizes=(1, 1))
    monkeypatch.setitem(shards._progress, "on", True)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["data", "stats", "--dataset", str(folder), "--model", "tiny"]) == 0
    assert "metadata of wds" in terminal.getvalue() and "2/2" in terminal.getvalue()  # shards done
    shutil.rmtree(folder / ".entrain_cache")
    terminal.seek(0), terminal.truncate(), capsys.readouterr()
    assert main(["data", "stats", "--dataset", str(folder), "--model", "tiny", "--json"]) == 0
    assert "metadata of" not in terminal.getvalue()
    assert json.loads(capsys.readouterr().out)["num_samples"] == 2


def test_an_unreadable_image_in_a_shard_names_its_place(tmp_path):
    shards = [records(0, 2)]
    shards[0][1]["image_bytes"] = shards[0][1]["image_bytes"][:30]  # a cut JPEG
    folder = write("webdataset", tmp_path / "wds", shards)
    (finding,) = check_dataset(folder, processor=False).errors
    assert (finding.index, finding.field) == (1, "images[0]")
    assert f"{folder / 'shard-00000.tar'} (bytes " in finding.reason
    with pytest.raises(
        DataError, match=r"shard-00000.tar:#1: field 'images\[0\]': .*shard-00000.tar \(bytes \d+"
    ):
        read_metadata(folder, use_cache=False)


def test_a_tar_samples_images_are_in_their_index_order_past_nine(tmp_path):
    """``k.0.png`` ... ``k.11.png``, stored out of order: the record's images follow the indices as
    numbers (``.2`` before ``.10``), each the bytes of its own member."""
    pictures = {i: image_bytes(i) for i in range(12)}
    record = {"id": "many", "conversations": [
        {"from": "human", "value": "<image>" * 12 + "\nWhich pictures?"},
        {"from": "gpt", "value": "Twelve."},
    ]}  # fmt: skip
    members = [("many.json", json.dumps(record).encode())]
    members += [(f"many.{i}.png", pictures[i]) for i in (10, 2, 0, 11, 1, 9, 3, 4, 8, 5, 7, 6)]
    (tmp_path / "wds").mkdir()
    shard = tmp_path / "wds" / "shard-00000.tar"
    with tarfile.open(shard, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    (parsed,) = iter_parsed(shard)
    assert not parsed.problems
    assert [ref.read_bytes() for ref in parsed.record.images] == [pictures[i] for i in range(12)]
