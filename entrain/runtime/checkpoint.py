"""Atomic, verified checkpoints of a pipeline run, and the choice of the one to resume from.

Layout of ``OUT/checkpoints/step-00000008/`` (the step count is the number of completed steps)::

    model-pp{p}.pt   written by the rank of replica 0 holding pipeline rank p: that rank's stage
                     parameters (full-model names, e.g. ``llm.model.layers.3.mlp.up_proj.weight``)
                     and its AdamW state (replicas hold bitwise equal copies, so one is kept)
    rank{r}.pt       written by every rank: step, data position and RNG states (python, numpy, torch)
    manifest.json    written last, by rank 0 after a gather: every file with its sha256 and size,
                     the layout, the run fingerprint and the data position

Every file is written to a temporary name, flushed, fsync-ed and renamed (then the folder is
fsync-ed), so a crash leaves either the old file or the new one. A checkpoint is *complete* when its
manifest exists and every file a rank reads matches the manifest's checksum; ``select_checkpoint``
walks the checkpoints newest first and takes the first complete one, saying on stderr (rank 0) why a
newer one was passed over. Files hold only tensors and plain containers (``torch.load(...,
weights_only=True)``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import sys
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
    "latest_manifest",
    "load_model_state",
    "prune",
    "rng_state",
    "set_rng_state",
    "step_dir",
]

CHECKPOINT_DIR = "checkpoints"
MANIFEST = "manifest.json"
FORMAT_VERSION = 1


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
    """What a rank gets back from a complete checkpoint."""

    step: int
    folder: Path
    manifest: dict
    model: dict | None
    """``{"params": {name: tensor}, "optimizer": state dict or None}`` of this rank's pipeline rank."""
    rank_state: dict
    """``{"step", "rng", "data_position"}`` of this rank."""


def model_file(pp_rank: int) -> str:
    return f"model-pp{pp_rank}.pt"


def rank_file(rank: int) -> str:
    return f"rank{rank}.pt"


def write_shards(
    folder: Path, *, rank: int, pp_rank: int, replica: int, model: dict | None, rank_state: dict
) -> dict[str, dict]:
    """This rank's files (``model`` only on replica 0); returns ``{name: {"sha256", "bytes", "rank"}}``."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = {}
    items = [(rank_file(rank), rank_state)]
    if replica == 0:
        items.append((model_file(pp_rank), model))
    for name, obj in items:
        data = _to_bytes(obj)
        atomic_write_bytes(folder / name, data)
        entries[name] = {"sha256": _sha256(data), "bytes": len(data), "rank": rank}
    return entries


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


def try_load(folder: Path, *, rank: int, pp_rank: int) -> tuple[Checkpoint | None, str | None]:
    """This rank's view of one checkpoint folder: the loaded state, or why it cannot be used."""
    manifest, why = _read_manifest(folder)
    if manifest is None:
        return None, why
    if manifest.get("format") != FORMAT_VERSION:
        return None, f"format {manifest.get('format')} (this version reads {FORMAT_VERSION})"
    payloads = {}
    for name in (model_file(pp_rank), rank_file(rank)):
        data, why = _read_verified(folder, manifest, name)
        if data is None:
            return None, why
        payloads[name] = _from_bytes(data)
    return (
        Checkpoint(
            step=int(manifest["step"]),
            folder=folder,
            manifest=manifest,
            model=payloads[model_file(pp_rank)],
            rank_state=payloads[rank_file(rank)],
        ),
        None,
    )


def select_checkpoint(
    out: str | Path,
    *,
    rank: int,
    pp_rank: int,
    agree: Callable[[str | None], list[str | None]],
    say: Callable[[str], None] | None = None,
) -> Checkpoint | None:
    """The newest checkpoint that is complete for every rank. ``agree`` all-gathers each rank's reason
    for refusing a candidate (None: usable), so all ranks pick the same one; ``say`` reports skipped
    candidates (rank 0's stderr)."""
    say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
    for step, folder in checkpoint_dirs(out):
        ckpt, why = try_load(folder, rank=rank, pp_rank=pp_rank)
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


def check_resumable(out: str | Path, fingerprint: dict, layout: dict | None = None) -> dict | None:
    """ConfigError when the newest checkpoint in ``out`` was written by a different configuration;
    returns its manifest (None when there is none)."""
    manifest = latest_manifest(out)
    if manifest is None:
        return None
    diff = fingerprint_mismatch(manifest.get("fingerprint", {}), fingerprint)
    if diff:
        raise ConfigError(
            f"--resume: the checkpoints in {out} were written by another configuration "
            f"({'; '.join(diff)}); rerun with the original flags, or train into a new --out"
        )
    if layout is not None and manifest.get("layout") != layout:
        raise ConfigError(
            f"--resume: the checkpoints in {out} hold a different stage layout ({manifest.get('layout')}) "
            f"than this run's ({layout}); rerun with the original flags, or train into a new --out"
        )
    return manifest


def load_model_state(folder: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(manifest, every stage parameter by full-model name) of a complete checkpoint folder; every
    model shard is verified against the manifest (ConfigError naming the file otherwise)."""
    folder = Path(folder)
    manifest, why = _read_manifest(folder)
    if manifest is None:
        raise ConfigError(f"checkpoint {folder}: {why}")
    params: dict[str, torch.Tensor] = {}
    for name in sorted(n for n in manifest["files"] if n.startswith("model-pp")):
        data, why = _read_verified(folder, manifest, name)
        if data is None:
            raise ConfigError(f"checkpoint {folder}: {why}")
        params.update(_from_bytes(data)["params"])
    return manifest, params
