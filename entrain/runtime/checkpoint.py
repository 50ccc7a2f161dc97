"""Atomic, verified checkpoints of a pipeline run, and the choice of the one to resume from.

Layout of ``OUT/checkpoints/step-00000008/`` (the step count is the number of completed steps)::

    .metadata, __R_0.distcp   the model parameters (``model/NAME``, full-model names, e.g.
                              ``model/llm.model.layers.3.mlp.up_proj.weight``) and AdamW state
                              (``optim/NAME/exp_avg``, ``.../exp_avg_sq``, ``.../step``), written
                              collectively by ``torch.distributed.checkpoint``: each rank writes the
                              shards it holds (DTensor shards under TP or FSDP), a tensor that DP
                              replicas hold alike is written once
    rank{r}.pt                written by every rank: step, data position and RNG states
    manifest.json             written last, by rank 0 once every file is written: every file with
                              its sha256 and size, the layout, the run fingerprint and the data
                              position. Each rank hashes the files it wrote (``owner_rank``), all
                              at once; rank 0 only merges the gathered hashes (no rank waits on
                              another's hashing of the whole checkpoint). On resume each rank
                              verifies its share of the files.

The tensor state is keyed by name, not by rank, so a run continues from a checkpoint written with
another DP degree, stage split, ``--tp`` or ``--fsdp``: each rank loads the names its stages hold,
resharded to its own placement. Every file of ours is written to a temporary name, flushed,
fsync-ed and renamed (then the folder is fsync-ed); the manifest comes last, so a checkpoint is
*complete* when its manifest exists and every file matches the manifest's checksum.

The run folder must be one folder that every node sees (a shared filesystem): every rank writes its
files into the same checkpoint folder and a resumed rank may read any of them. A multi-process run
checks this before training (``check_shared_folder``) and refuses a node-local folder in one line.
``select_checkpoint`` walks the checkpoints newest first and takes the first complete one, saying on
stderr (rank 0) why a newer one was passed over. Files hold only tensors and plain containers
(``torch.load(..., weights_only=True)``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from entrain.core.errors import ConfigError

__all__ = [
    "CHECKPOINT_DIR",
    "MANIFEST",
    "Checkpoint",
    "atomic_write_bytes",
    "checkpoint_dirs",
    "fingerprint_mismatch",
    "check_base_content",
    "latest_manifest",
    "load_model_state",
    "load_state",
    "save_state",
    "prune",
    "rng_state",
    "set_rng_state",
    "step_dir",
]

CHECKPOINT_DIR = "checkpoints"
MANIFEST = "manifest.json"
FORMAT_VERSION = 2
MODEL_PREFIX = "model/"
"""Key prefix of the parameters in the tensor state (``optim/NAME/exp_avg`` ... for AdamW's)."""
OPTIM_PREFIX = "optim/"


def step_dir(out: str | Path, step: int) -> Path:
    return Path(out) / CHECKPOINT_DIR / f"step-{step:08d}"


def checkpoint_dirs(out: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every checkpoint folder under ``out``, newest first."""
    root = Path(out) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        if d.is_dir() and d.name.startswith("step-") and d.name[5:].isdigit():
            found.append((int(d.name[5:]), d))
    return sorted(found, key=lambda x: -x[0])


# --- atomic files -------------------------------------------------------------------------------


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file: write, flush, fsync, rename, fsync folder."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _to_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _from_bytes(data: bytes):
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


# --- RNG ----------------------------------------------------------------------------------------


def rng_state() -> dict:
    """Python, numpy and torch (CPU and current CUDA device) generator states as tensors / lists."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# --- saving -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint every rank can use (its files verified against the manifest)."""

    step: int
    folder: Path
    manifest: dict
    rank_state: dict
    """``{"step", "rng", "data_position"}`` of this rank (of rank 0 when the checkpoint was written by
    fewer ranks than this run has)."""


def rank_file(rank: int) -> str:
    return f"rank{rank}.pt"


def write_rank_state(folder: Path, rank: int, rank_state: dict) -> None:
    """This rank's step, RNG states and data position (atomic)."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / rank_file(rank), _to_bytes(rank_state))


def save_state(folder: Path, state: dict[str, torch.Tensor], process_group=None) -> None:
    """Collective: the model and optimizer tensors (plain or DTensor, keyed by full-model names) through
    ``torch.distributed.checkpoint``; tensors that several ranks hold under one key are written once."""
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # a step saved again after a restart overwrites its own files
        warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder)), process_group=process_group)


def load_state(folder: Path, state: dict[str, torch.Tensor], process_group=None) -> None:
    """Collective: fill ``state``'s tensors in place from the checkpoint, resharding to this run's
    layout (another DP degree, stage split, TP degree or FSDP sharding)."""
    import torch.distributed.checkpoint as dcp

    dcp.load(state, storage_reader=dcp.FileSystemReader(str(folder)), process_group=process_group)


def saved_keys(folder: Path) -> set[str]:
    """The tensor keys a checkpoint holds (from its ``torch.distributed.checkpoint`` metadata)."""
    import torch.distributed.checkpoint as dcp

    return set(dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata)


def file_entries(folder: Path, keep: Callable[[str], bool] | None = None) -> dict[str, dict]:
    """``{name: {"sha256", "bytes"}}`` of every file in ``folder`` but the manifest (those ``keep``
    accepts)."""
    entries = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != MANIFEST and ".tmp-" not in path.name:
            if keep is not None and not keep(path.name):
                continue
            data = path.read_bytes()
            entries[path.name] = {"sha256": _sha256(data), "bytes": len(data)}
    return entries


_DCP_SHARD = re.compile(r"__(\d+)_\d+\.distcp")
_RANK_FILE = re.compile(r"rank(\d+)\.pt")


def owner_rank(name: str, world_size: int) -> int:
    """The rank that wrote a checkpoint file, and hashes it: ``rank{r}.pt`` and
    ``torch.distributed.checkpoint``'s shard files ``__{r}_{i}.distcp`` are rank r's; the rest
    (``.metadata``, a stale file of an earlier attempt with more ranks) rank 0's."""
    match = _DCP_SHARD.fullmatch(name) or _RANK_FILE.fullmatch(name)
    rank = int(match.group(1)) if match else 0
    return rank if rank < world_size else 0


def own_file_entries(folder: Path, rank: int, world_size: int) -> dict[str, dict]:
    """``file_entries`` of the files ``rank`` wrote (``owner_rank``): every rank hashes its own, at the
    same time, and rank 0 merges the small results into the manifest."""
    return file_entries(folder, keep=lambda name: owner_rank(name, world_size) == rank)


def write_manifest(folder: Path, manifest: dict) -> None:
    atomic_write_bytes(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())


def prune(out: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints, and incomplete folders older than the
    newest complete one (left by a crash). Returns the deleted folders."""
    deleted = []
    complete = 0
    for _, d in checkpoint_dirs(out):
        if (d / MANIFEST).exists():
            complete += 1
            if complete <= keep:
                continue
        elif complete == 0:
            continue  # newer than every complete checkpoint: may be being written
        shutil.rmtree(d, ignore_errors=True)
        deleted.append(d)
    return deleted


# --- one run folder for every node -------------------------------------------------------------


def check_shared_folder(folder: str | Path, rank: int, agree: Callable, wait_s: float = 2.0) -> None:
    """ConfigError unless every rank sees a file rank 0 writes in ``folder``: every rank writes its
    checkpoint files into one folder and a resumed rank reads any of them, so the run folder must be
    one folder that every node shares (node-local run folders are refused, not supported). ``agree``
    all-gathers one value per rank; ``wait_s``: how long a rank looks for the file."""
    token = uuid.uuid4().hex if rank == 0 else None
    if rank == 0:
        atomic_write_bytes(Path(folder) / f"{SHARED_MARKER}{token}", token.encode())
    token = agree(token)[0]
    marker = Path(folder) / f"{SHARED_MARKER}{token}"
    hosts = agree(None if _sees(marker, token, wait_s) else socket.gethostname())
    if rank == 0:
        marker.unlink(missing_ok=True)
    blind = [f"rank {r} on {host}" for r, host in enumerate(hosts) if host is not None]
    if blind:
        raise ConfigError(
            f"--out {folder} is not one folder that every node shares: {', '.join(blind[:4])} does not see "
            "a file rank 0 wrote there; checkpoints need a shared filesystem (node-local run folders are not "
            "supported)"
        )


SHARED_MARKER = ".entrain-shared-"


def _sees(marker: Path, token: str, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if marker.read_text() == token:
                return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


# --- choosing and reading -----------------------------------------------------------------------


def _read_verified(folder: Path, manifest: dict, name: str) -> tuple[bytes | None, str | None]:
    entry = manifest.get("files", {}).get(name)
    if entry is None:
        return None, f"{name} is not listed in the manifest"
    path = folder / name
    if not path.exists():
        return None, f"{name} is missing"
    data = path.read_bytes()
    if len(data) != entry["bytes"] or _sha256(data) != entry["sha256"]:
        return None, f"{name} is corrupt (size or sha256 differs from the manifest)"
    return data, None


def _read_manifest(folder: Path) -> tuple[dict | None, str | None]:
    path = folder / MANIFEST
    if not path.exists():
        return None, "no manifest (the save did not finish)"
    try:
        return json.loads(path.read_text()), None
    except (OSError, ValueError) as e:
        return None, f"unreadable manifest ({e})"


def verify_all(folder: Path, manifest: dict, share: tuple[int, int] = (0, 1)) -> str | None:
    """Why the checkpoint's files do not match its manifest (None: they all do). ``share`` =
    ``(index, count)``: only every ``count``-th file from ``index`` (a rank's part of the work)."""
    index, count = share
    for name in sorted(manifest.get("files", {}))[index::count]:
        _, why = _read_verified(folder, manifest, name)
        if why is not None:
            return why
    return None


def try_load(
    folder: Path, *, rank: int, verify_tensors: bool = True, share: tuple[int, int] = (0, 1)
) -> tuple[Checkpoint | None, str | None]:
    """This rank's view of one checkpoint folder: its rank state (rank 0's when the writing run had
    fewer ranks), or why the checkpoint cannot be used. ``verify_tensors``: also check the sha256 of
    the files of ``share`` (``verify_all``; default: every file)."""
    manifest, why = _read_manifest(folder)
    if manifest is None:
        return None, why
    if manifest.get("format") != FORMAT_VERSION:
        return None, f"format {manifest.get('format')} (this version reads {FORMAT_VERSION})"
    if verify_tensors:
        why = verify_all(folder, manifest, share)
        if why is not None:
            return None, why
    name = rank_file(rank) if rank_file(rank) in manifest.get("files", {}) else rank_file(0)
    data, why = _read_verified(folder, manifest, name)
    if data is None:
        return None, why
    return Checkpoint(int(manifest["step"]), folder, manifest, _from_bytes(data)), None


def select_checkpoint(
    out: str | Path,
    *,
    rank: int,
    agree: Callable[[str | None], list[str | None]],
    say: Callable[[str], None] | None = None,
    world_size: int = 1,
) -> Checkpoint | None:
    """The newest checkpoint that is complete for every rank. ``agree`` all-gathers each rank's reason
    for refusing a candidate (None: usable), so all ranks pick the same one; each of the
    ``world_size`` ranks verifies the sha256 of its share of the files (``verify_all``) and its own
    rank state; ``say`` reports skipped candidates (rank 0's stderr)."""
    say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
    for step, folder in checkpoint_dirs(out):
        ckpt, why = try_load(folder, rank=rank, share=(rank, world_size))
        reasons = agree(why)
        bad = [(r, w) for r, w in enumerate(reasons) if w is not None]
        if not bad:
            return ckpt
        detail = "; ".join(f"rank {r}: {w}" for r, w in bad[:4])
        say(
            f"entrain: checkpoint {folder} (step {step}) is incomplete or corrupt ({detail}); "
            "using the previous complete checkpoint"
        )
    return None


def latest_manifest(out: str | Path) -> dict | None:
    """The manifest of the newest checkpoint that has one (no shard verification)."""
    for _, folder in checkpoint_dirs(out):
        manifest, _ = _read_manifest(folder)
        if manifest is not None:
            return manifest
    return None


def fingerprint_mismatch(saved: dict, current: dict) -> list[str]:
    """``key: saved -> current`` for every fingerprint key that differs."""
    keys = sorted(set(saved) | set(current))
    return [f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in keys if saved.get(k) != current.get(k)]


RESHARDABLE = ("dp", "tp", "fsdp", "ep", "encoder_stages", "llm_stages")
"""Fingerprint keys a resumed run may change: the checkpoint is resharded to the new layout."""


ADDED_LATER = ("checkpoint_fingerprint",)
"""Fingerprint keys compared only when the saved manifest has them (runs from before stay resumable)."""


def check_base_content(saved: dict, now: dict, head: str, action: str) -> None:
    """ConfigError when a base checkpoint folder of the run (``--model-path`` ...) holds other content
    (``checkpoint_fingerprint``) than when ``saved`` was written: one line naming the folder and both
    fingerprints, before a shape mismatch deep in the loader."""
    before, after = saved.get("checkpoint_fingerprint") or {}, now.get("checkpoint_fingerprint") or {}
    for dest, was in before.items():
        folder = saved.get(dest)
        if dest in after and after[dest] != was and now.get(dest, folder) == folder:  # the same folder
            flag = "--" + dest.replace("_", "-")
            raise ConfigError(
                f"{head} {flag} {folder} when it held other content (fingerprint "
                f"{was[:12]}, now {after[dest][:12]}: its config.json, preprocessor_config.json or tensors "
                f"changed since): restore that checkpoint, or start a new run instead of {action}"
            )


def check_resumable(out: str | Path, fingerprint: dict) -> dict | None:
    """ConfigError when the newest checkpoint in ``out`` was written by a different configuration
    (other than the layout keys of ``RESHARDABLE``, and a value a re-plan set on its own checkpoint
    where the run resumes with exactly that value: ``entrain.runtime.replan.replanned_values``); returns
    its manifest (None when there is none)."""
    from entrain.runtime.replan import replanned_values

    manifest = latest_manifest(out)
    if manifest is None:
        return None
    saved = {k: v for k, v in manifest.get("fingerprint", {}).items() if k not in RESHARDABLE}
    now = {
        k: v for k, v in fingerprint.items() if k not in RESHARDABLE and (k in saved or k not in ADDED_LATER)
    }
    for k, value in replanned_values(str(out), int(manifest.get("step", -1))).items():
        if k in saved and now.get(k) == value:  # the re-plan's change, not the user's
            now[k] = saved[k]
    check_base_content(saved, now, f"--resume: the checkpoints in {out} were trained from", "--resume")
    diff = fingerprint_mismatch(saved, now)
    if diff:
        raise ConfigError(
            f"--resume: the checkpoints in {out} were written by another configuration "
            f"({'; '.join(diff)}); rerun with the original flags, or train into a new --out"
        )
    return manifest


def load_model_state(folder: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(manifest, every stage parameter by full-model name) of a complete checkpoint folder, read in
    this process without a process group; every file is verified against the manifest (ConfigError
    naming the file otherwise)."""
    folder = Path(folder)
    manifest, why = _read_manifest(folder)
    if manifest is None:
        raise ConfigError(f"checkpoint {folder}: {why}")
    if manifest.get("format") != FORMAT_VERSION:
        raise ConfigError(
            f"checkpoint {folder}: format {manifest.get('format')} (this version reads {FORMAT_VERSION})"
        )
    why = verify_all(folder, manifest)
    if why is not None:
        raise ConfigError(f"checkpoint {folder}: {why}")
    from entrain.models.families.registry import family_of_manifest

    state = read_tensors(folder, {k for k in saved_keys(folder) if k.startswith(MODEL_PREFIX)})
    params = {k[len(MODEL_PREFIX) :]: v for k, v in state.items()}
    return manifest, family_of_manifest(manifest).fuse_parts(params)


def read_tensors(folder: str | Path, keys: set[str] | None = None) -> dict[str, torch.Tensor]:
    """Whole tensors ``keys`` (default: all) of a checkpoint, read in this process alone."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is unavailable or uninitialized")
        return _load_state_dict_from_keys(keys, checkpoint_id=str(folder), process_group=None)
