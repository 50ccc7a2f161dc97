"""``entrain train``: flags, refusals, the in-process (1-rank) path and the README main job."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from entrain.cli.main import main

FAST = [
    "--model",
    "tiny",
    "--dataset",
    "skewed",
    "--global-batch",
    "4",
    "--microbatch-size",
    "1",
    "--no-progress",
]


def test_cp_and_unsplittable_tp_are_refused_before_any_process_group(capsys):
    import torch.distributed as dist

    assert main(["train", *FAST, "--tp", "3"]) == 2
    assert "--tp 3 must divide the sharded dimensions" in capsys.readouterr().err
    assert main(["train", *FAST, "--cp", "2"]) == 2
    assert "CP = 2" in capsys.readouterr().err
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--checkpoint-every", "-1"], "argument --checkpoint-every: must be >= 0"),
        (["--timeout-s", "0"], "argument --timeout-s: must be > 0"),
        (["--system", "nope"], "unknown system"),
        (
            ["--global-batch", "5", "--microbatch-size", "2"],
            "not divisible by dp 1 x --microbatch-size 2 = 2",
        ),
        (["--global-batch", "6", "--microbatch-size", "2", "--dp", "2"], "use --global-batch 8"),
        (
            ["--encoder-stages", "1", "--nproc", "3"],
            "3 processes cannot form whole replicas of 2 pipeline ranks",
        ),
        (["--llm-stages", "1", "--nproc", "3"], "--nproc 2 or 4"),
        (["--dp", "2", "--nproc", "2"], "needs 4 processes, but 2 were started: start 4 processes"),
        (["--llm-stages", "99"], "use 1.."),
    ],
)
def test_bad_or_pending_flags_give_one_line_errors(flags, message, capsys):
    assert main(["train", *FAST, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_single_process_dip_run_writes_the_run_folder(tmp_path, capsys):
    """DIP with 1 + 1 colocated stages needs one process: runs in this process, no torchrun."""
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            *FAST,
            "--system",
            "dip",
            "--steps",
            "4",
            "--lr",
            "3e-3",
            "--val-every",
            "2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    line = capsys.readouterr().out.strip()
    assert re.fullmatch(r"system=dip iter_ms=[\d.]+ stage_std_ms=[\d.]+ loss=[\d.]+->[\d.]+", line)
    assert {"config.json", "plan.json", "metrics.jsonl"} <= set(os.listdir(out))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.3  # it learns (Zipf text statistics)
    assert [("val_loss" in r) for r in rows] == [False, True, False, True]
    assert rows[0]["lr"] == pytest.approx(1.5e-3)  # warm-up step 1 of 2
    for r in rows:
        keys = {"step", "loss", "iteration_time_ms", "tokens_per_s", "stage_times", "cpu_ms"}
        assert keys | {"assignment_wait_ms"} <= set(r)
        assert r["tokens_per_s"] > 0 and r["loss"] > 0
        stages = {(t["stage"], t["mb"], t["sub"]) for t in r["stage_times"]}
        assert {s for s, _, _ in stages} == {0, 1}
        assert all(t["fwd_ms"] > 0 and t["bwd_ms"] > 0 and t["rank"] == 0 for t in r["stage_times"])
    plan = json.loads((out / "plan.json").read_text())
    assert plan["system"] == "dip" and len(plan["iterations"]) == 4
    config = json.loads((out / "config.json").read_text())
    assert config["world_size"] == 1 and config["backend"] in ("gloo", "nccl")


@pytest.mark.slow
def test_readme_main_job_with_two_steps(tmp_path):
    """The README main job (``entrain train --demo``) on 2 torchrun processes, 2 steps per system, at
    the global batch the README's journey runs it with (4 microbatches; the demo's 16 train the same
    code path, slower)."""
    out = tmp_path / "demo"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "entrain",
            "train",
            "--demo",
            "--steps",
            "2",
            "--global-batch",
            "4",
            "--no-progress",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["system=entrain", "system=1f1b"]
    losses = [re.search(r"loss=([\d.]+)->([\d.]+)", line).groups() for line in lines]
    assert losses[0] == losses[1]  # exact math: the same samples give the same loss under both systems
    for system in ("entrain", "1f1b"):
        rows = [json.loads(x) for x in (out / system / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == 2
        assert {t["rank"] for t in rows[0]["stage_times"]} == {0, 1}


def test_stage_std_is_per_replica_stage_over_microbatches():
    from entrain.runtime.run_metrics import stage_std_ms

    rows = [
        {"rank": rank, "stage": 0, "mb": mb, "sub": sub, "fwd_ms": f, "bwd_ms": 0.0}
        for rank, mb, sub, f in [
            (0, 0, 0, 1.0),
            (0, 0, 1, 1.0),
            (0, 1, 0, 4.0),
            (2, 0, 0, 10.0),
            (2, 1, 0, 10.0),
        ]
    ]
    # rank 0: microbatches 2 ms and 4 ms -> std 1; rank 2 (other replica): 10 and 10 -> std 0
    assert stage_std_ms(rows) == pytest.approx(0.5)


def test_a_global_batch_below_b_min_warns_that_balance_is_not_guaranteed(capsys):
    from entrain.cli.main import build_parser
    from entrain.cli.train import _spec
    from entrain.runtime.preflight import warn_below_b_min

    argv = ["train", "--dataset", "skewed", "--encoder-stages", "4", "--llm-stages", "4"]
    spec = _spec(build_parser().parse_args([*argv, "--global-batch", "16", "--microbatch-size", "1"]))
    b_min = warn_below_b_min(spec)
    err = capsys.readouterr().err
    assert b_min > 16
    assert f"below b_min = {b_min}" in err and "balance guarantee no longer holds" in err
    spec = _spec(build_parser().parse_args([*argv, "--global-batch", str(b_min), "--microbatch-size", "1"]))
    assert warn_below_b_min(spec) == b_min and capsys.readouterr().err == ""


def test_an_unknown_dataset_is_one_line_before_any_launch(capsys):
    assert main(["train", *FAST, "--dataset", "no-such-file.jsonl"]) == 2
    err = capsys.readouterr().err.strip()
    assert "neither a built-in dataset" in err and "\n" not in err
