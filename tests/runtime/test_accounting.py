"""Nothing lost, nothing twice: every valid sample is trained once per epoch (also across a resume
inside an epoch and at an epoch boundary), a remainder carries into the next epoch, Plans and losses
are deterministic (plan hash per step), skipped samples are listed -- counted by sample id."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from entrain.cli.main import main
from entrain.data.workload_io import write_workload_jsonl
from entrain.runtime.accounting import EpochStream

from .cases import batch_metas, works


def _rows(out) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _ids(rows) -> list[str]:
    return [i for r in rows for i in r["sample_ids"]]


def test_epoch_stream_carries_the_remainder_and_reshuffles_per_epoch():
    ws = works(batch_metas(10))
    stream = EpochStream(tuple(ws), seed=3, shuffle=True)
    batches = stream.batches(4, 5)  # 20 samples: epochs 0 and 1, the boundary inside step 2
    flat = [w.id for b in batches for w in b]
    assert all(len(b) == 4 for b in batches)
    assert sorted(flat[:10]) == sorted(w.id for w in ws) == sorted(flat[10:])
    assert flat[:10] != flat[10:]  # another order in epoch 1
    assert all(len({w.id for w in b}) == 4 for b in batches)  # step 2 spans the boundary: no sample twice
    assert stream.position(2, 4).to_json() == {
        "step": 2,
        "samples_consumed": 8,
        "epoch": 0,
        "offset_in_epoch": 8,
    }
    assert stream.position(3, 4).epoch == 1 and stream.position(3, 4).offset_in_epoch == 2
    assert [w.id for w in EpochStream(tuple(ws), seed=3, shuffle=False).batches(4, 1)[0]] == [
        "s0",
        "s1",
        "s2",
        "s3",
    ]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "ten.jsonl"
    write_workload_jsonl(str(path), batch_metas(10))
    return path


ARGV = ["train", "--model", "tiny", "--system", "dip", "--microbatch-size", "1", "--no-progress", "--shuffle"]


@pytest.mark.parametrize(
    ("batch", "steps", "every", "crash_at", "resume_epoch_offset"),
    [
        (4, 5, 2, 3, (0, 8)),  # resume inside epoch 0; its remainder (2) completes step 2 with epoch 1
        (2, 8, 5, 6, (1, 0)),  # resume exactly at the epoch boundary (step 5 = 10 samples)
    ],
)
def test_every_sample_once_per_epoch_across_a_resume(
    dataset, tmp_path, monkeypatch, capsys, batch, steps, every, crash_at, resume_epoch_offset
):
    out = tmp_path / "run"
    argv = [*ARGV, "--dataset", str(dataset), "--global-batch", str(batch), "--steps", str(steps)]
    argv += ["--checkpoint-every", str(every), "--out", str(out)]
    monkeypatch.setenv("ENTRAIN_FAULT", f"raise:0:{crash_at}")
    assert main(argv) == 2
    assert f"injected fault at step {crash_at}" in capsys.readouterr().err
    monkeypatch.delenv("ENTRAIN_FAULT")
    assert main([*argv, "--resume"]) == 0
    capsys.readouterr()
    rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(steps))
    ids = _ids(rows)
    assert len(ids) == batch * steps  # never padded
    assert Counter(ids[:10]) == Counter(f"s{i}" for i in range(10))  # epoch 0: each sample once
    assert len(set(ids[10:20])) == len(ids[10:20])  # epoch 1 so far: no sample twice
    manifest = json.loads((out / "checkpoints" / f"step-{every:08d}" / "manifest.json").read_text())
    epoch, offset = resume_epoch_offset
    assert (
        manifest["data_position"]["epoch"] == epoch and manifest["data_position"]["offset_in_epoch"] == offset
    )
    assert [r["epoch"] for r in rows] == [(s * batch) // 10 for s in range(steps)]


def test_same_seed_same_plans_and_losses(dataset, tmp_path, capsys):
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        argv = [*ARGV, "--dataset", str(dataset), "--global-batch", "4", "--steps", "2", "--out", str(out)]
        assert main(argv) == 0
        runs.append(_rows(out))
    capsys.readouterr()
    assert [r["plan_hash"] for r in runs[0]] == [r["plan_hash"] for r in runs[1]]
    assert [r["loss"] for r in runs[0]] == [r["loss"] for r in runs[1]]
    assert len({r["plan_hash"] for r in runs[0]}) == 2


@pytest.fixture(scope="module")
def llava_with_a_bad_record(tmp_path_factory):
    """6 synthesised LLaVA samples (real images and text) plus one whose image file is missing."""
    out = tmp_path_factory.mktemp("llava")
    assert main(["data", "synth", "--dataset", "cocoqa", "--num-samples", "6", "--out", str(out)]) == 0
    path = out / "data.json"
    records = json.loads(path.read_text())
    bad = dict(records[0], id="broken", image="missing.jpg")
    path.write_text(json.dumps([*records[:3], bad, *records[3:]]))
    return path, [r["id"] for r in records]


def test_bad_samples_are_skipped_and_listed_or_stop_training(llava_with_a_bad_record, tmp_path, capsys):
    path, good = llava_with_a_bad_record
    capsys.readouterr()
    argv = [*ARGV, "--dataset", str(path), "--global-batch", "2", "--steps", "3"]
    out = tmp_path / "stop"
    assert main([*argv, "--out", str(out)]) == 2  # --on-bad-sample error (the default)
    err = capsys.readouterr().err
    assert "broken" in err and "missing.jpg" in err and not (out / "metrics.jsonl").exists()
    out = tmp_path / "skip"
    assert main([*argv, "--on-bad-sample", "skip", "--out", str(out)]) == 0
    skipped = [json.loads(x) for x in (out / "skipped.jsonl").read_text().splitlines()]
    assert [s["id"] for s in skipped] == ["broken"] and skipped[0]["reasons"]
    assert Counter(_ids(_rows(out))) == Counter(good)  # 3 steps x 2 = the 6 valid samples, once each


def test_resume_refuses_a_dataset_that_changed(tmp_path, capsys):
    path, out = tmp_path / "data.jsonl", tmp_path / "run"
    write_workload_jsonl(str(path), batch_metas(10))
    argv = [*ARGV, "--dataset", str(path), "--global-batch", "4", "--steps", "1", "--out", str(out)]
    assert main(argv) == 0
    write_workload_jsonl(str(path), batch_metas(10)[:9])
    assert main([*argv, "--steps", "2", "--resume"]) == 2
    assert "changed since the checkpoint" in capsys.readouterr().err
