"""``entrain export RUN_DIR --out DIR``: one Hugging Face-loadable checkpoint from a run's stage shards.

The newest complete checkpoint of ``RUN_DIR/checkpoints`` (every model shard verified against its
manifest; a corrupt one is passed over with a message) is assembled and written as the run's model
family's Hugging Face folder(s) (``ModelFamily.export``) plus ``DIR/entrain_export.json`` (model,
step, source run, image token id). A composition writes ``DIR/vision/`` (the vision tower, its merger
projecting to the LLM width) and ``DIR/llm/`` (the causal LM); image features replace the LLM
embeddings at the image-pad positions. The same folder is accepted by ``entrain train --weights DIR``.

``DIR`` is written whole or not at all: the folders go to a temporary sibling ``.DIR.tmp-PID`` that
is renamed to ``DIR`` at the end (a failed export removes it and leaves ``DIR`` as it was). A
``DIR`` that is not empty is refused without ``--overwrite``; the run's own folder and the base
checkpoints it was trained from (``--weights``, ``--vision-model``, ``--llm-model``, ``--model-path`` in
its ``config.json``), any folder inside them (the run's ``checkpoints/``, a step) or around them, and
with ``--overwrite`` a folder holding any training run, are refused.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from entrain.cli.argtypes import is_run_folder
from entrain.cli.common import add_shared_flags
from entrain.core.errors import ConfigError
from entrain.models.families.export_dtype import DEFAULT_EXPORT_DTYPE, EXPORT_DTYPES

EXPORT_INFO = "entrain_export.json"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export", help="write a run's checkpoint as Hugging Face folders", description=__doc__
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a training run folder (with checkpoints/)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--step", type=int, default=None, help="export this step's checkpoint (default: newest)")
    p.add_argument(
        "--dtype",
        choices=EXPORT_DTYPES,
        default=DEFAULT_EXPORT_DTYPE,
        help="the weights' dtype (default float32: the trained master weights as they are; bfloat16 "
        "halves the files and is what published checkpoints ship)",
    )
    add_shared_flags(p, "export", "json", "overwrite")
    p.set_defaults(func=run)


def _choose(run_dir: str, step: int | None) -> tuple[dict, dict]:
    from entrain.runtime.checkpoint import checkpoint_dirs, load_model_state

    found = checkpoint_dirs(run_dir)
    steps = sorted(s for s, _ in found)
    if step is not None:
        found = [(s, d) for s, d in found if s == step]
    if not found:
        held = f" (it holds step(s) {', '.join(map(str, steps))})" if steps else ""
        what = f"no checkpoint of step {step}" if step is not None else "no checkpoints"
        subs = (
            sorted(d.name for d in Path(run_dir).iterdir() if (d / "checkpoints").is_dir())
            if os.path.isdir(run_dir)
            else []
        )
        hint = f"; it holds runs {', '.join(subs)}: pass one of them" if subs else ""
        raise ConfigError(f"{run_dir}: {what} found under checkpoints/{held}{hint}")
    for _, folder in found:
        try:
            return load_model_state(folder)
        except ConfigError as e:
            print(f"entrain: {e}; trying the previous checkpoint", file=sys.stderr, flush=True)
    raise ConfigError(f"{run_dir}: no complete checkpoint (every one is missing a file or corrupt)")


BASE_FLAGS = ("weights", "vision_model", "llm_model", "model_path")
"""The run's ``config.json`` flags that name a checkpoint folder the run was trained from."""


def _base_folders(run_dir: str) -> dict[str, Path]:
    """``{flag: folder}`` of the checkpoints ``run_dir`` was trained from (its ``config.json``)."""
    try:
        flags = json.loads(Path(run_dir, "config.json").read_text()).get("flags", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {k: Path(flags[k]).resolve() for k in BASE_FLAGS if isinstance(flags.get(k), str)}


def check_out(run_dir: str, out: str, overwrite: bool) -> None:
    """ConfigError for an ``--out`` that would replace the run, a base checkpoint it was trained from
    (even with ``--overwrite``), or a non-empty folder (without ``--overwrite``)."""
    target = Path(out).resolve()
    run = Path(run_dir).resolve()
    guarded = {"the run folder": run} if is_run_folder(run) else {}  # not a run: _choose names what it lacks
    guarded |= {
        f"the base checkpoint the run was trained from (--{k.replace('_', '-')})": v
        for k, v in _base_folders(run_dir).items()
    }
    for what, folder in guarded.items():
        if folder.is_relative_to(target):  # replacing --out would remove it
            raise ConfigError(f"--out {out} would overwrite {what} {folder}; export into another folder")
        if target.is_relative_to(folder):  # inside it: its checkpoints, a step, any folder of it
            raise ConfigError(f"--out {out} is inside {what} {folder}; export into a folder outside it")
    held = _run_under(target) if overwrite and target.is_dir() else None
    if held is not None:
        raise ConfigError(f"--out {out} would overwrite the run folder {held}; export into another folder")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise ConfigError(
            f"--out {out} is not empty: pass --overwrite to replace what it holds, or export into a new folder"
        )
    if target.exists() and not target.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")


def _run_under(folder: Path) -> Path | None:
    """A training run folder inside ``folder`` (``--overwrite`` would remove it); None when none is."""
    for root, dirs, _ in os.walk(folder):
        if is_run_folder(Path(root)):
            return Path(root)
        dirs[:] = [d for d in dirs if not d.startswith(".")]
    return None


@contextmanager
def _staged(out: str):
    """A temporary sibling of ``out`` to write into, renamed to ``out`` when the block succeeds (the
    old ``out`` removed only then) and removed when it fails."""
    target = Path(out).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def export(
    run_dir: str,
    out: str,
    step: int | None = None,
    overwrite: bool = False,
    dtype: str = DEFAULT_EXPORT_DTYPE,
) -> dict:
    """Write the HF folders into ``out`` whole (through a temporary folder), the weights in ``dtype``
    (``export_dtype.cast_export``); returns the summary (also written as ``entrain_export.json``)."""
    check_out(run_dir, out, overwrite)
    with _staged(out) as tmp:
        info = _export_into(run_dir, str(tmp), step, dtype)
        info = _relocated(info, str(tmp), str(out))
        Path(tmp, EXPORT_INFO).write_text(json.dumps(info, indent=1) + "\n")
    return info


def _relocated(info: dict, tmp: str, out: str) -> dict:
    """The summary with the temporary folder's paths renamed to ``out``'s."""

    def moved(path: str) -> str:
        return str(Path(out)) + path[len(tmp) :] if path.startswith(tmp) else path

    paths = {k: moved(v) for k, v in info.items() if isinstance(v, str) and k != "run"}
    return {**info, **paths, "out": out, "files": [moved(f) for f in info["files"]]}


def _export_into(run_dir: str, out: str, step: int | None = None, dtype: str = DEFAULT_EXPORT_DTYPE) -> dict:
    """Write the run's model family's Hugging Face folder(s) into ``out`` (``ModelFamily.export``),
    the weights in ``dtype``; returns the summary (also written as ``entrain_export.json``)."""
    from entrain.models.families.export_dtype import cast_export
    from entrain.models.families.registry import family_of_manifest

    manifest, params = _choose(run_dir, step)
    check_base_unchanged(run_dir, manifest)
    try:
        fields = family_of_manifest(manifest).export(manifest, params, out)
    except ConfigError as e:
        raise ConfigError(f"{run_dir}: {e}") from None
    num_parameters = sum(v.numel() for v in params.values())
    del params  # the trained float32 tensors are written: not held while the files are cast
    cast_export(out, dtype)
    return _write_info(run_dir, out, manifest, num_parameters, {**fields, "dtype": dtype})


def check_base_unchanged(run_dir: str, manifest: dict) -> None:
    """ConfigError when a base checkpoint folder the run was trained from (its ``--model-path``, read
    again by the export) now holds other content than the checkpoint's fingerprint recorded."""
    from entrain.core.planning.plan_file import checkpoint_fingerprints
    from entrain.runtime.checkpoint import check_base_content

    saved = manifest.get("fingerprint") or {}
    folders = {k: saved.get(k) for k in (saved.get("checkpoint_fingerprint") or {})}
    try:
        now = {"checkpoint_fingerprint": checkpoint_fingerprints({k: v for k, v in folders.items() if v})}
    except ConfigError as e:
        raise ConfigError(f"{run_dir}: the base checkpoint it was trained from: {e}") from None
    check_base_content(saved, now, f"{run_dir}: trained from", "exporting it")


def _write_info(run_dir: str, out: str, manifest: dict, num_parameters: int, fields: dict) -> dict:
    """The export summary (the family's ``fields``: folders, ``image_token_id``, ``files``), also
    written as ``entrain_export.json``."""
    info = {
        "run": str(run_dir),
        "step": int(manifest["step"]),
        "model": manifest["model"],
        "system": manifest.get("system"),
        "out": str(out),
        **{k: v for k, v in fields.items() if k != "files"},
        "num_parameters": num_parameters,
        "files": fields["files"],
    }
    Path(out, EXPORT_INFO).write_text(json.dumps(info, indent=1) + "\n")
    return info


def run(args: argparse.Namespace) -> int:
    info = export(args.run_dir, args.out, args.step, overwrite=args.overwrite, dtype=args.dtype)
    if args.json:
        from entrain.cli.common import emit_json

        emit_json(info)
    else:
        folders = list(dict.fromkeys(info[k] for k in ("model_dir", "vision", "llm") if k in info))
        print(
            f"exported step {info['step']} of {info['run']} ({info['model']}, "
            f"{info['num_parameters']:,} parameters) to {' and '.join(folders)}"
        )
    return 0
