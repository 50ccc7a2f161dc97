"""``entrain train`` on a sharded dataset: two forked gloo ranks train one
step of Entrain on WebDataset tar shards with real images, whose pixels are read back from the tars
by location; a bad record is skipped and named by shard and index in ``skipped.jsonl``. The readers
of the three shard formats share this path (``iter_parsed`` -> screening -> ``RecordSource``)."""

from __future__ import annotations

import json
import math

from entrain.cli.main import build_parser
from entrain.cli.train import _spec
from entrain.runtime.preflight import check_spec, world_size_of
from entrain.runtime.session import run_systems
from tests.data.shard_writers import records, write
from tests.runtime.harness import run_workers


def _train(env, spec):
    return [s.last_loss for s in run_systems(spec, env)]


def test_two_ranks_train_a_step_on_tar_shards_skipping_a_bad_record(tmp_path):
    shards = [records(k, 3) for k in range(3)]
    shards[1][2]["conversations"] = shards[1][2]["conversations"][:1]  # no assistant turn: skipped
    folder, run = write("webdataset", tmp_path / "wds", shards), tmp_path / "run"
    argv = [
        "train",
        "--dataset",
        str(folder),
        "--model",
        "tiny",
        "--system",
        "entrain",
        "--encoder-stages",
        "1",
    ]
    argv += ["--llm-stages", "1", "--global-batch", "4", "--microbatch-size", "1", "--steps", "1"]
    spec = _spec(
        build_parser().parse_args([*argv, "--on-bad-sample", "skip", "--out", str(run), "--no-progress"])
    )
    check_spec(spec)
    assert world_size_of(spec) == 2
    losses = run_workers(_train, 2, tmp_path / "workers", spec)
    assert losses[0] == losses[1] and all(math.isfinite(x) and x > 0 for x in losses[0])
    (skipped,) = [json.loads(x) for x in (run / "skipped.jsonl").read_text().splitlines()]
    assert (skipped["file"], skipped["index"], skipped["id"]) == (str(folder / "shard-00001.tar"), 2, "s1-2")
    trained = json.loads((run / "plan.json").read_text())
    assert {s["id"] for s in trained["samples"]} <= {r["id"] for s in shards for r in s} - {"s1-2"}
