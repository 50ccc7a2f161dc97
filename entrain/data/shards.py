"""Sharded datasets: a folder of Parquet shards, of WebDataset ``.tar`` shards, or a Hugging Face
``datasets`` folder written by ``save_to_disk``; and scanning shards in parallel processes.

Layouts (``dataset_shards``):

- Hugging Face ``save_to_disk``: ``state.json`` lists the arrow files (``_data_files``), IPC
  *stream* files with LLaVA fields (``conversations``/``messages``, ``image``/``images`` as the
  ``datasets`` Image feature ``{bytes, path}``, ``id``), read with pyarrow (memory-mapped, one
  record batch at a time; the ``datasets`` package is not needed). A ``DatasetDict`` folder
  (``dataset_dict.json``) is refused with the split folders to pass instead.
- Parquet shards: the folder's ``*.parquet`` files in name order (``entrain.data.parquet``).
- WebDataset shards: the folder's ``*.tar`` files in name order (``entrain.data.webdataset``).

Every shard is streamed, and a record is named by its shard file and its 0-based index in it.
``map_shards`` runs a function over the shards in worker processes (forked, so the function and
its tokenizer need no pickling) and yields the results in shard order, with a progress bar on
stderr (``progress_bar``; off when stderr is not a terminal and under ``--json``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

from entrain.core.errors import ConfigError, DataError
from entrain.core.workload.samples import SampleMeta, VisionTokenConfig
from entrain.data.problems import unread
from entrain.data.records import ImageRef, Parsed

__all__ = [
    "dataset_shards",
    "is_sharded_dataset",
    "iter_arrow",
    "iter_shard",
    "iter_sharded",
    "map_shards",
    "progress_bar",
    "read_sharded_metadata",
    "scan_workers",
    "set_progress",
    "with_progress",
]

HF_STATE = "state.json"
HF_INFO = "dataset_info.json"
HF_DICT = "dataset_dict.json"
MAX_DEFAULT_WORKERS = 8

_progress = {"on": True}


# --- layout -------------------------------------------------------------------------------------


def _hf_shards(folder: Path) -> list[tuple[Path, str]]:
    try:
        state = json.loads((folder / HF_STATE).read_text(encoding="utf-8"))
        names = [f["filename"] for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{folder / HF_STATE}: not a Hugging Face save_to_disk state (want '_data_files': "
            f"[{{'filename': ...}}]): {type(e).__name__}: {e}"
        ) from None
    shards = [(folder / name, "arrow") for name in names]
    missing = [str(p) for p, _ in shards if not p.is_file()]
    if missing or not shards:
        raise ConfigError(
            f"{folder / HF_STATE}: lists arrow file(s) that are missing: {', '.join(missing) or 'none listed'}"
        )
    return shards


def dataset_shards(folder: str | Path) -> list[tuple[Path, str]]:
    """``[(shard file, format)]`` of a sharded dataset folder, in read order; a one-line DataError for
    a folder with no shards, ConfigError for one that mixes shard kinds or is a DatasetDict."""
    p = Path(folder)
    if (p / HF_DICT).is_file():
        splits = sorted(q.name for q in p.iterdir() if (q / HF_STATE).is_file())
        raise ConfigError(
            f"{p}: a Hugging Face DatasetDict; pass one split's folder ({', '.join(str(p / s) for s in splits) or 'none found'})"
        )
    if (p / HF_STATE).is_file():
        return _hf_shards(p)
    files = sorted(q for q in p.iterdir() if q.is_file())
    parquet = [(q, "parquet") for q in files if q.suffix.lower() == ".parquet"]
    tars = [(q, "webdataset") for q in files if q.suffix.lower() == ".tar"]
    if parquet and tars:
        raise ConfigError(f"{p}: holds both .parquet and .tar shards; keep one kind per dataset folder")
    if not parquet and not tars:
        raise DataError(
            str(p), None, None,
            f"not a regular file (a directory) with no .parquet or .tar shards and no Hugging Face save_to_disk "
            f"dataset ({HF_STATE}); --dataset takes a file, a built-in name or such a folder",
        )  # fmt: skip
    return parquet or tars


def is_sharded_dataset(folder: str | Path) -> bool:
    try:
        return bool(dataset_shards(folder))
    except (ConfigError, DataError, OSError):
        return False


# --- readers ------------------------------------------------------------------------------------


def iter_arrow(path: str | Path, image_root: str | Path | None = None) -> Iterator[Parsed]:
    """Parse every row of a ``save_to_disk`` arrow (IPC stream) file, one record batch at a time."""
    import pyarrow as pa

    from entrain.data.parquet import LLAVA_COLUMNS, llava_row, read_columns

    p = Path(path)
    base = Path(image_root) if image_root is not None else p.parent
    index = 0
    try:
        reader = pa.ipc.open_stream(pa.memory_map(str(p)))
        names = set(reader.schema.names)
        if "conversations" not in names and "messages" not in names:
            reason = (
                f"arrow file has no 'conversations' or 'messages' column (it has {', '.join(sorted(names))})"
            )
            yield Parsed(str(p), 0, None, None, None, [("conversations", reason)], True)
            return
        columns = read_columns(reader.schema, LLAVA_COLUMNS)
        for batch in reader:
            for row in batch.select(columns).to_pylist():

                def ref_of(column: str, i: int, data: bytes, row_index: int = index) -> ImageRef:
                    return ImageRef("arrow", str(p), (row_index, i), column, data)

                yield llava_row(row, str(p), index, p.stem, base, ref_of)
                index += 1
    except (pa.ArrowInvalid, OSError) as e:
        reason = (
            f"not a readable arrow stream (cut off or corrupt?): {' '.join(str(e).split())}; {unread(index)}"
        )
        yield Parsed(str(p), index, None, None, None, [("arrow", reason)], True)


def iter_shard(path: str | Path, fmt: str, image_root: str | Path | None = None) -> Iterator[Parsed]:
    """The records of one shard of format ``fmt`` (``parquet``, ``webdataset`` or ``arrow``)."""
    if fmt == "parquet":
        from entrain.data.parquet import iter_parquet

        return iter_parquet(path, image_root)
    if fmt == "webdataset":
        from entrain.data.webdataset import iter_tar

        return iter_tar(path, image_root)
    if fmt == "arrow":
        return iter_arrow(path, image_root)
    raise ValueError(f"unknown shard format {fmt!r}")


def iter_sharded(folder: str | Path, image_root: str | Path | None = None) -> Iterator[Parsed]:
    """Every record of a sharded dataset folder, shard after shard (image paths relative to
    ``image_root`` or the folder)."""
    root = image_root if image_root is not None else folder
    for shard, fmt in dataset_shards(folder):
        yield from iter_shard(shard, fmt, root)


# --- parallel scanning --------------------------------------------------------------------------


def set_progress(on: bool) -> None:
    """Turn the scanning progress bar on or off (the CLI turns it off under ``--json``)."""
    _progress["on"] = on


def progress_bar(total: int | None, desc: str, unit: str = "shard"):
    """A tqdm bar on stderr, disabled when off (``set_progress``) or stderr is not a terminal. It
    starts no monitor thread (a thread would make ``scan_workers`` scan in this process)."""
    from tqdm import tqdm

    class _Bar(tqdm):
        monitor_interval = 0

    on = _progress["on"] and sys.stderr.isatty()
    return _Bar(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not on, mininterval=0.5)


def with_progress(items: Iterable, desc: str) -> Iterator:
    """``items`` counted on a progress bar of records (a single file's scan)."""
    bar = progress_bar(None, desc, "record")
    try:
        for item in items:
            bar.update(1)
            yield item
    finally:
        bar.close()


def scan_workers(num_shards: int, requested: int | None = None) -> int:
    """Worker processes for ``num_shards`` shards: ``requested``, or the CPUs shared among the ranks
    of this node (torchrun's ``LOCAL_WORLD_SIZE``: every rank screens the dataset), at most
    ``MAX_DEFAULT_WORKERS``; never more than the shards, and 1 (in this process) where another
    Python thread runs (forking then is unsafe)."""
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    wanted = requested if requested is not None else min((os.cpu_count() or 1) // ranks, MAX_DEFAULT_WORKERS)
    if threads_running():
        return 1
    return max(1, min(wanted, num_shards))


def threads_running() -> bool:
    """Another Python thread is alive in this process (a fork would copy the locks it holds)."""
    return threading.active_count() > 1


_task: dict[str, Callable] = {}


def _set_task(fn: Callable) -> None:
    _task["fn"] = fn


def _run_task(item):
    return _task["fn"](item)


def map_shards(fn: Callable, shards: list, *, workers: int | None = None, desc: str = "scanning") -> Iterator:
    """``fn(shard)`` for each shard, in shard order, in ``scan_workers`` forked processes (in this
    process for one), with a progress bar. ``fn`` is inherited by the fork, never pickled; its
    results are. An exception in a worker is raised here."""
    num = scan_workers(len(shards), workers)
    bar = progress_bar(len(shards), desc)
    try:
        if num <= 1:
            for shard in shards:
                result = fn(shard)
                bar.update(1)
                yield result
            return
        yield from _pooled(fn, shards, num, bar)
    finally:
        bar.close()


def _pooled(fn: Callable, shards: list, num: int, bar) -> Iterator:
    import multiprocessing as mp

    pool = ProcessPoolExecutor(num, mp_context=mp.get_context("fork"), initializer=_set_task, initargs=(fn,))
    try:
        for result in pool.map(_run_task, shards):
            bar.update(1)
            yield result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def read_sharded_metadata(
    folder,
    image_root,
    tok,
    vision: VisionTokenConfig,
    file_metadata: Callable,
    cache_dir=None,
    use_cache: bool = True,
    workers=None,
) -> list[SampleMeta]:
    """``SampleMeta`` of every record of a sharded dataset folder, in shard order. Each shard is
    cached on its own (``entrain.data.metadata_cache``); the shards not in the cache are scanned
    by ``file_metadata(shard, root, tok, vision, cache_dir, use_cache)`` (``entrain.data.llava``'s,
    which stores the shard's cache) in parallel processes (``map_shards``). Raises DataError
    (shard, index, field) at a bad record."""
    from entrain.data import metadata_cache

    root = image_root if image_root is not None else folder
    shards = dataset_shards(folder)
    cached: list[list[SampleMeta] | None] = [None] * len(shards)
    if use_cache:
        for i, (shard, _) in enumerate(shards):
            key = metadata_cache.cache_key(shard, root, tok.name, vision)
            cached[i] = metadata_cache.load(shard, key, vision, cache_dir)
    todo = [s for s, c in zip(shards, cached, strict=True) if c is None]
    scan = partial(_shard_metadata, file_metadata, root, tok, vision, cache_dir, use_cache)
    fresh = iter(list(map_shards(scan, todo, workers=workers, desc=f"metadata of {Path(folder).name}")))
    return [m for c in cached for m in (c if c is not None else next(fresh))]


def _shard_metadata(
    file_metadata: Callable, root, tok, vision, cache_dir, use_cache, shard
) -> list[SampleMeta]:
    return file_metadata(shard[0], root, tok, vision, cache_dir, use_cache)


def flatten(results: Iterable[list]) -> Iterator:
    for items in results:
        yield from items
