"""Checkpoint hashes are computed by each rank for the files it wrote, at the
same time (rank 0 only merges them into the manifest), and a resume verifies them, each rank its
share of the files: no rank waits while another hashes the whole checkpoint. A run folder that some
node does not share is refused before training."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist

from entrain.cli import train as train_cli
from entrain.cli.main import build_parser
from entrain.core.errors import ConfigError
from entrain.runtime import checkpoint as ck
from entrain.runtime.checkpointer import Checkpointer, agree
from entrain.runtime.health import PeerWatch
from entrain.runtime.run_data import RunData

from .cases import batch_metas, plan_for, works
from .harness import run_workers

STEP = 2


def test_each_file_has_one_owner_rank():
    assert [ck.owner_rank(n, 2) for n in ("rank1.pt", "__1_0.distcp", "__0_3.distcp", ".metadata")] == [
        1,
        1,
        0,
        0,
    ]
    assert ck.owner_rank("rank3.pt", 2) == 0  # a stale file of an attempt with more ranks: rank 0's


def _save_then_resume(env, spec, layout, out):
    hashed: list[str] = []
    entries = ck.file_entries

    def spy(folder, keep=None):
        found = entries(folder, keep)
        hashed.extend(found)
        return found

    ck.file_entries = spy  # forked worker: every hash of a checkpoint file goes through here
    watch = PeerWatch(env.rank, env.world_size, 30.0)
    state = {f"model/w{env.rank}": torch.full((4096,), float(env.rank))}
    trainer = SimpleNamespace(watch=watch, checkpoint_state=lambda: state)
    Checkpointer(spec, "1f1b", layout, env, str(out), RunData([], []), watch).save(trainer, STEP)
    verify = agree(env, watch, "resume")
    found = ck.select_checkpoint(out, rank=env.rank, agree=verify, world_size=env.world_size)
    dist.barrier()
    if env.rank == 0:  # corrupt a file of rank 1's share (every other file, from the second)
        name = sorted(found.manifest["files"])[1]
        (ck.step_dir(out, STEP) / name).write_bytes(b"corrupt")
    dist.barrier()
    said = []
    again = ck.select_checkpoint(out, rank=env.rank, agree=verify, say=said.append, world_size=env.world_size)
    return sorted(hashed), found.manifest["files"], again, said


def test_each_rank_hashes_its_own_files_and_resume_verifies_its_share(tmp_path):
    args = build_parser().parse_args(["train", "--model", "tiny", "--system", "1f1b", "--global-batch", "4"])
    spec = train_cli._spec(args)
    layout = plan_for("1f1b", 1, 1, 1, 4, works(batch_metas())).layout
    out = tmp_path / "run"
    (rank0, files, again0, said0), (rank1, _, again1, _) = run_workers(
        _save_then_resume, 2, tmp_path / "workers", spec, layout, out
    )
    assert set(rank1) == {"rank1.pt", "__1_0.distcp"}, "rank 1 hashes exactly its own files"
    assert set(rank0) == set(files) - set(rank1), "rank 0 hashes only its own files"
    on_disk = {p.name for p in ck.step_dir(out, STEP).iterdir() if p.name != ck.MANIFEST}
    assert set(files) == on_disk, "the manifest lists every file"
    assert again0 is None and again1 is None
    assert "rank 1: " in said0[0] and "corrupt" in said0[0]


def _check_folder(env, folders):
    watch = PeerWatch(env.rank, env.world_size, 30.0)
    try:
        ck.check_shared_folder(folders[env.rank], env.rank, agree(env, watch, "shared"), wait_s=0.2)
    except ConfigError as e:
        return str(e)
    return None


def test_a_run_folder_some_node_does_not_share_is_refused_in_one_line(tmp_path):
    """Two "nodes": rank 1's run folder is its own (node-local) one; every rank refuses, naming it."""
    shared, local = tmp_path / "shared", tmp_path / "node1-local"
    shared.mkdir()
    local.mkdir()
    assert run_workers(_check_folder, 2, tmp_path / "w1", [shared, shared]) == [None, None]
    assert not [p for p in shared.iterdir()], "the marker is removed"
    errors = run_workers(_check_folder, 2, tmp_path / "w2", [shared, local])
    assert all("\n" not in e and "every node shares: rank 1 on " in e for e in errors), errors
    assert f"--out {shared} is not one folder that every node shares: rank 1 on " in errors[0]
