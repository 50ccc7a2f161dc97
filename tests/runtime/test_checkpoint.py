"""Checkpoints: atomic files, manifest last, corrupt or missing shards passed over, pruning, and exact
resume: 2N steps straight == N steps, a crash, ``--resume``, N more -- bitwise.

Which guarantee holds where: on the CPU (gloo) a resumed run is bitwise the straight run, always;
on a GPU only with ``--deterministic`` (torch's deterministic algorithms: some CUDA kernels, e.g.
atomics-based reductions in backward, otherwise differ from run to run). The ``gpu`` test below
asserts the GPU case. Every other model family (``families.FAMILY_MODELS``) resumes bitwise after a
crash too (2 steps, a checkpoint after each, the crash in step 1)."""

from __future__ import annotations

import io
import json
import random

import numpy as np
import pytest
import torch

from entrain.cli.main import main
from entrain.runtime import checkpoint as ck

from .cli_ranks import cli_argv
from .families import FAMILY_MODELS, family_flags

FAST = [
    "train",
    "--model",
    "tiny",
    "--dataset",
    "skewed",
    "--system",
    "dip",
    "--global-batch",
    "4",
    "--microbatch-size",
    "1",
    "--steps",
    "4",
    "--checkpoint-every",
    "2",
    "--no-progress",
]


def _rows(out) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _state(out, step: int) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint: ``model/NAME`` parameters and ``optim/NAME/KEY`` AdamW state."""
    return ck.read_tensors(ck.step_dir(out, step))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """4 steps without interruption, checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("straight") / "run"
    assert main([*FAST, "--out", str(out)]) == 0
    return out


def test_exact_resume_after_a_crash_is_bitwise_the_straight_run(straight, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    monkeypatch.setenv("ENTRAIN_FAULT", "raise:0:2")  # dies in step 2, after the step-2 checkpoint
    assert main([*FAST, "--out", str(out)]) == 2
    assert "injected fault at step 2" in capsys.readouterr().err
    assert [r["step"] for r in _rows(out)] == [0, 1]
    assert main([*FAST, "--out", str(out), "--resume"]) == 0
    assert "resuming dip from" in capsys.readouterr().err
    _assert_bitwise_resume(straight, out)


def _assert_bitwise_resume(straight, out, steps: int = 4) -> None:
    a, b = _rows(straight), _rows(out)
    assert [r["step"] for r in b] == list(range(steps))
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert [r["plan_hash"] for r in a] == [r["plan_hash"] for r in b]
    assert [r["sample_ids"] for r in a] == [r["sample_ids"] for r in b]
    state_a, state_b = _state(straight, steps), _state(out, steps)
    assert state_a.keys() == state_b.keys()
    assert sum(k.startswith("model/") for k in state_a) > 10
    assert sum(k.endswith("/exp_avg_sq") for k in state_a) > 10
    for name in state_a:
        assert torch.equal(state_a[name], state_b[name]), name
    config = json.loads((out / "config.json").read_text())
    assert config["resumed_from_step"] == steps // 2


@pytest.mark.parametrize("family", FAMILY_MODELS)
def test_every_family_resumes_bitwise(family, tmp_path, monkeypatch, capsys):
    """2 steps straight (a checkpoint after each); its step-1 checkpoint resumed for step 2 (the crash
    itself: the composition's test above). Each step is planned in line (no planner process)."""
    import shutil

    monkeypatch.setenv("ENTRAIN_PLAN_PREFETCH", "0")
    fast = FAST[FAST.index("--dataset") :]
    fast[fast.index("--steps") + 1], fast[fast.index("--checkpoint-every") + 1] = "2", "1"
    argv = [*cli_argv("train", family_flags(family, tmp_path / "model")), *fast]
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert main([*argv, "--out", str(straight)]) == 0
    shutil.copytree(straight, out)
    shutil.rmtree(ck.step_dir(out, 2))
    (out / "metrics.jsonl").write_text((straight / "metrics.jsonl").read_text().splitlines()[0] + "\n")
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    assert "resuming dip from" in capsys.readouterr().err
    _assert_bitwise_resume(straight, out, steps=2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_resume_is_bitwise_with_deterministic(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ENTRAIN_DEVICE", "cuda")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    gpu = [*FAST, "--deterministic"]
    try:
        assert main([*gpu, "--out", str(tmp_path / "straight")]) == 0
        monkeypatch.setenv("ENTRAIN_FAULT", "raise:0:2")
        assert main([*gpu, "--out", str(tmp_path / "run")]) == 2
        monkeypatch.delenv("ENTRAIN_FAULT")
        assert main([*gpu, "--out", str(tmp_path / "run"), "--resume"]) == 0
    finally:
        torch.use_deterministic_algorithms(False)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["device"].startswith("cuda")
    _assert_bitwise_resume(tmp_path / "straight", tmp_path / "run")


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(straight, tmp_path, capsys):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(straight, out)
    shard = ck.step_dir(out, 4) / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main([*FAST, "--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "step 4) is incomplete or corrupt (rank 0: __0_0.distcp is corrupt" in err
    assert "using the previous complete checkpoint" in err and "step-00000002 (step 2 of 4)" in err
    state_a, state_b = _state(straight, 4), _state(out, 4)  # step 4 retrained from step 2, saved again
    assert all(torch.equal(state_a[n], state_b[n]) for n in state_a)


def test_resume_refuses_another_configuration_before_any_process_group(straight, tmp_path, capsys):
    import shutil

    import torch.distributed as dist

    out = tmp_path / "run"
    shutil.copytree(straight, out)
    argv = [*FAST, "--out", str(out), "--resume"]
    argv[argv.index("--global-batch") + 1] = "8"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--resume: the checkpoints in" in err and "global_batch: 4 -> 8" in err and "new --out" in err
    assert not dist.is_initialized()


def test_resume_with_nothing_to_resume_starts_fresh(tmp_path, capsys):
    out = tmp_path / "run"
    argv = [*FAST, "--out", str(out), "--resume", "--steps", "1"]
    assert main(argv) == 0
    assert "no complete checkpoint" in capsys.readouterr().err
    assert [r["step"] for r in _rows(out)] == [0]


def test_missing_file_or_manifest_is_detected(tmp_path):
    folder = ck.step_dir(tmp_path, 3)
    ck.write_rank_state(folder, 0, {"step": 3})
    (folder / "__0_0.distcp").write_bytes(b"tensors")
    found, why = ck.try_load(folder, rank=0)
    assert found is None and "no manifest" in why
    ck.write_manifest(folder, {"format": ck.FORMAT_VERSION, "step": 3, "files": ck.file_entries(folder)})
    found, why = ck.try_load(folder, rank=0)
    assert why is None and found.step == 3 and found.rank_state == {"step": 3}
    found, why = ck.try_load(folder, rank=1)  # a run with more ranks than wrote it: rank 0's state
    assert why is None and found.rank_state == {"step": 3}
    (folder / "__0_0.distcp").write_bytes(b"tensorz")
    assert ck.try_load(folder, rank=0) == (
        None,
        "__0_0.distcp is corrupt (size or sha256 differs from the manifest)",
    )
    assert ck.try_load(folder, rank=0, verify_tensors=False)[1] is None
    (folder / "rank0.pt").unlink()
    assert ck.try_load(folder, rank=0, verify_tensors=False) == (None, "rank0.pt is missing")
    assert not [p for p in folder.iterdir() if ".tmp" in p.name]  # no temporary files left


def test_prune_keeps_the_newest_complete_checkpoints(tmp_path):
    for step in (2, 4, 6, 8):
        folder = ck.step_dir(tmp_path, step)
        folder.mkdir(parents=True)
        ck.write_manifest(folder, {})
    ck.step_dir(tmp_path, 1).mkdir()  # incomplete, older than complete ones: a crash leftover
    ck.step_dir(tmp_path, 10).mkdir()  # incomplete, newest: maybe being written
    ck.prune(tmp_path, keep=2)
    assert [s for s, _ in ck.checkpoint_dirs(tmp_path)] == [10, 8, 6]


def test_rng_states_round_trip():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = ck.rng_state()
    expect = (random.random(), float(np.random.rand()), float(torch.rand(())))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    restored = torch.load(io.BytesIO(ck._to_bytes(state)), weights_only=True)  # as a checkpoint stores it
    ck.set_rng_state(restored)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == expect


@pytest.mark.parametrize(
    "layout",
    [
        ("--dp", "2", "--encoder-stages", "2", "--llm-stages", "2", "--fsdp"),
        ("--tp", "2", "--encoder-stages", "2", "--llm-stages", "2"),
    ],
    ids=["dp2-stages2+2-fsdp", "tp2-stages2+2"],
)
def test_resume_on_another_layout_continues_the_straight_run(straight, tmp_path, layout):
    """The step-2 checkpoint of the 1-process run, continued on 4 forked processes with another DP
    degree, stage split, ``--fsdp`` or ``--tp``: steps 2 and 3 lose what the straight run lost
    (relative 1e-5; sums run in another order), and the step-4 checkpoint the sharded run writes
    holds the straight run's parameters (to 1e-2: AdamW divides by the root of tiny second moments,
    which magnifies round-off; a misplaced shard is off by order 1)."""
    import shutil

    from .cli_ranks import run_ranks

    out = tmp_path / "run"
    shutil.copytree(straight, out)
    shutil.rmtree(ck.step_dir(out, 4))
    results = run_ranks([*FAST, "--out", str(out), "--resume", *layout], 4, tmp_path / "ranks", timeout_s=200)
    assert [r.exitcode for r in results] == [0] * 4, results[0].stderr[-3000:]
    assert "resuming dip from" in results[0].stderr
    a, b = _rows(straight), _rows(out)
    assert [r["step"] for r in b] == [0, 1, 2, 3]
    for ra, rb in zip(a[2:], b[2:]):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5), (ra["loss"], rb["loss"])
        assert ra["sample_ids"] == rb["sample_ids"]
    assert len(b[3]["memory_per_rank"]) == 4
    _, want = ck.load_model_state(ck.step_dir(straight, 4))
    _, got = ck.load_model_state(ck.step_dir(out, 4))
    assert want.keys() == got.keys()
    for name in want:
        err = float((got[name] - want[name]).norm() / want[name].norm().clamp_min(1e-12))
        assert err < 1e-2, (name, err)
