"""Workload files and the ``--dataset`` resolver every planner/simulator command uses.

Formats (docs/contract.md, "Names"), one JSON object per line, detected per file from the first
record's keys:

- workload JSONL: ``{"id": str, "images": [[H, W], ...], "text_tokens": int}`` (pixels, tokens), optionally
  ``"answer_tokens": int`` (the supervised tokens, what ``lm_head`` and the loss run on) and ``"audio":
  [frames, ...]`` (mel frames per audio clip, for a family that reads audio) and ``"video": [[t, h, w],
  ...]`` (each video's encoder patch grid, for a family that reads video);
- raw-work JSONL: ``{"id": str, "encoder": ms, "llm": ms}``: per-sample forward+backward ms of the
  whole component on one replica, used as given (the cost model is not consulted);
- LLaVA JSON/JSONL (records with ``conversations``), Parquet, and sharded dataset folders (Parquet or
  WebDataset shards, a Hugging Face ``save_to_disk`` folder): read by ``entrain.data.llava``.

A bad record raises ``DataError`` naming ``file:line`` and the field; blank lines are skipped.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from entrain.core.costs.costmodel import CostModel
from entrain.core.errors import ConfigError, DataError
from entrain.core.files import file_problem
from entrain.core.workload.samples import DEFAULT_VISION, SampleMeta, VisionTokenConfig, smart_resize
from entrain.core.workload.work import SampleWork
from entrain.data.generators import DATASETS, batch_source, canonical_name, generate_samples, is_builtin

__all__ = [
    "detect_format",
    "load_workload",
    "read_workload_jsonl",
    "write_workload_jsonl",
    "read_raw_work_jsonl",
    "read_samples",
    "sample_works",
    "resolve_dataset_file",
]

WORKLOAD_KEYS = ("id", "images", "text_tokens")
RAW_WORK_KEYS = ("id", "encoder", "llm")
LLAVA_KEYS = ("conversations", "messages")


# --- format detection ---------------------------------------------------------------------------


def _first_record(path: str) -> tuple[int, str] | None:
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                return line_no, line
    return None


def detect_format(path: str) -> str:
    """``"conversation"`` for a LLaVA/ShareGPT JSON or JSONL or a FineVision-style Parquet file,
    else ``"workload"`` or ``"raw_work"`` from the first record's keys; ConfigError for other JSON
    arrays or an empty file, DataError for a first record of no known format."""
    from entrain.data.llava import is_conversation_file

    if is_conversation_file(path):
        return "conversation"
    first = _first_record(path)
    if first is None:
        raise ConfigError(f"{path}: file has no records")
    line_no, line = first
    if line.lstrip().startswith("["):
        raise ConfigError(f"{path}: a JSON array; workload files are JSONL (one JSON object per line)")
    record = parse_line(path, line_no, line)
    if "encoder" in record or "llm" in record:
        return "raw_work"
    if "images" in record or "text_tokens" in record:
        return "workload"
    raise DataError(
        path, line_no, None,
        f"unknown record format with keys {sorted(record)}; expected {list(WORKLOAD_KEYS)} "
        f"(workload) or {list(RAW_WORK_KEYS)} (raw work)",
    )  # fmt: skip


# --- record parsing -----------------------------------------------------------------------------


def parse_line(path: str, line_no: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(path, line_no, None, f"invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict):
        raise DataError(path, line_no, None, f"expected a JSON object, got {type(record).__name__}")
    return record


def _json(value: Any, limit: int = 80) -> str:
    """A record's value as JSON text for a message (never a Python repr), shortened."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _field(path: str, line_no: int, record: dict, name: str) -> Any:
    if name not in record:
        raise DataError(path, line_no, name, "missing")
    return record[name]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return (isinstance(x, int | float)) and not isinstance(x, bool)


def _parse_id(path: str, line_no: int, record: dict) -> str:
    sample_id = _field(path, line_no, record, "id")
    if not isinstance(sample_id, str) or not sample_id:
        raise DataError(path, line_no, "id", f"expected a non-empty string, got {_json(sample_id)}")
    return sample_id


def _parse_images(
    path: str, line_no: int, record: dict, vision: VisionTokenConfig
) -> tuple[tuple[int, int], ...]:
    images = _field(path, line_no, record, "images")
    if not isinstance(images, list):
        raise DataError(path, line_no, "images", f"expected a list of [H, W] pairs, got {_json(images)}")
    out = []
    for k, size in enumerate(images):
        if not (isinstance(size, list) and len(size) == 2 and all(_is_int(x) for x in size)):
            raise DataError(
                path, line_no, "images", f"image {k}: expected [H, W] integers, got {_json(size)}"
            )
        if size[0] <= 0 or size[1] <= 0:
            raise DataError(path, line_no, "images", f"image {k}: sizes must be positive, got {size}")
        try:
            smart_resize(size[0], size[1], vision)
        except ValueError as e:
            raise DataError(path, line_no, "images", f"image {k}: {e}") from None
        out.append((size[0], size[1]))
    return tuple(out)


def parse_workload(path: str, line_no: int, record: dict, vision: VisionTokenConfig) -> SampleMeta:
    sample_id = _parse_id(path, line_no, record)
    images = _parse_images(path, line_no, record, vision)
    text = _field(path, line_no, record, "text_tokens")
    if not _is_int(text) or text < 0:
        raise DataError(path, line_no, "text_tokens", f"expected an integer >= 0, got {_json(text)}")
    if text == 0 and not images:
        raise DataError(path, line_no, "text_tokens", "sample has no images and no text tokens")
    answer = record.get("answer_tokens")
    if answer is not None and (not _is_int(answer) or not 0 <= answer <= text):
        raise DataError(
            path,
            line_no,
            "answer_tokens",
            f"expected an integer in 0..text_tokens ({text}), got {_json(answer)}",
        )
    audio = record.get("audio", [])
    if not (isinstance(audio, list) and all(_is_int(f) and f > 0 for f in audio)):
        raise DataError(
            path, line_no, "audio", f"expected a list of mel frame counts > 0, got {_json(audio)}"
        )
    video = record.get("video", [])
    if not (isinstance(video, list) and all(isinstance(g, list) and len(g) == 3 and all(_is_int(x) and x > 0 for x in g)
                                            for g in video)):  # fmt: skip
        raise DataError(
            path, line_no, "video", f"expected a list of [t, h, w] patch grids (positive), got {_json(video)}"
        )
    return SampleMeta(sample_id, images, text, vision, answer, tuple(audio), tuple(tuple(g) for g in video))


def _parse_raw_work(path: str, line_no: int, record: dict) -> SampleWork:
    sample_id = _parse_id(path, line_no, record)
    values = []
    for name in ("encoder", "llm"):
        x = _field(path, line_no, record, name)
        if not _is_number(x) or not math.isfinite(x) or x < 0:
            raise DataError(path, line_no, name, f"expected a finite number of ms >= 0, got {_json(x)}")
        values.append(float(x))
    return SampleWork(sample_id, values[0], values[1], None)


def _read_records(path: str, parse: Callable[[int, dict], Any]) -> list[Any]:
    out, first_line = [], {}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = parse_line(path, line_no, line)
            except DataError as e:
                if line.endswith("\n"):
                    raise
                from entrain.data.problems import unread  # the last line, cut short: a truncated file

                raise DataError(path, line_no, None, f"{e.reason}; {unread(len(out))}") from None
            item = parse(line_no, record)
            if item.id in first_line:
                raise DataError(
                    path, line_no, "id", f"duplicate id {item.id!r} (first on line {first_line[item.id]})"
                )
            first_line[item.id] = line_no
            out.append(item)
    return out


def read_workload_jsonl(path: str, vision: VisionTokenConfig = DEFAULT_VISION) -> list[SampleMeta]:
    """Samples of a workload JSONL in file order."""
    return _read_records(str(path), lambda n, r: parse_workload(str(path), n, r, vision))


def read_raw_work_jsonl(path: str) -> list[SampleWork]:
    """Per-sample work of a raw-work JSONL in file order (``meta`` is ``None``)."""
    return _read_records(str(path), lambda n, r: _parse_raw_work(str(path), n, r))


def write_workload_jsonl(path: str, samples: Iterable[SampleMeta]) -> None:
    """One ``{"id", "images", "text_tokens"}`` object per line."""
    with open(path, "w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps(s.to_json(), separators=(",", ":")) + "\n")


def read_samples(
    path: str, vision: VisionTokenConfig = DEFAULT_VISION, image_root: str | None = None
) -> list[SampleMeta]:
    """Sample metadata of a workload JSONL or a LLaVA/Parquet dataset (image headers and chat-formatted
    token counts, cached next to the data); ConfigError for formats that carry none (raw work)."""
    fmt = detect_format(path)
    if fmt == "conversation":
        from entrain.data.llava import read_metadata

        return read_metadata(path, image_root, vision=vision)
    if fmt != "workload":
        raise ConfigError(f"{path}: a raw-work file has no token metadata; expected a workload JSONL")
    return read_workload_jsonl(path, vision)


# --- per-sample work ----------------------------------------------------------------------------


def sample_works(
    samples: Sequence[SampleMeta], cost: CostModel, tp: int = 1, cp: int = 1, memo: dict | None = None
) -> list[SampleWork]:
    """``cost.sample_work(s, tp, cp)`` for each sample, memoised per component on the sample's
    sequence units and label tokens (``CostModel.units`` / ``labels``, the only inputs of
    ``sample_work``): the encoder part is costed once per distinct image-size tuple, the LLM part once
    per distinct (sequence length, label tokens). Pass
    the same ``memo`` dict to reuse it across calls with the same ``cost``, ``tp`` and ``cp``."""
    memo = {} if memo is None else memo
    out = []
    for s in samples:
        enc_key = ("encoder", cost.units("encoder", s))
        llm_key = ("llm", cost.units("llm", s), cost.labels("llm", s))
        if enc_key not in memo or llm_key not in memo:
            w = cost.sample_work(s, tp, cp)
            memo.setdefault(enc_key, w.encoder)
            memo.setdefault(llm_key, w.llm)
        out.append(SampleWork(s.id, memo[enc_key], memo[llm_key], s))
    return out


# --- the --dataset resolver ---------------------------------------------------------------------


def _check_batching(global_batch: int, iterations: int) -> None:
    if global_batch <= 0 or iterations <= 0:
        raise ConfigError(
            f"--global-batch and --iterations must be positive, got {global_batch} and {iterations}"
        )


def resolve_dataset_file(name: str) -> str:
    """``name`` if it is a readable dataset file or a sharded dataset folder (``entrain.data.shards``),
    else ConfigError saying why."""
    if os.path.isdir(name):
        from entrain.data.shards import dataset_shards

        try:
            dataset_shards(name)
        except OSError as e:
            raise ConfigError(f"--dataset {name}: {e.strerror or e}") from None
        return name
    problem = file_problem(name)
    if problem is not None and problem != "no such file":
        raise ConfigError(f"--dataset {name}: {problem}")
    if problem is not None:
        raise ConfigError(
            f"--dataset {name!r} is neither a built-in dataset ({', '.join(DATASETS)}, alias llava_instruct_150k) "
            f"nor an existing file"
        )
    return name


def _file_works(
    path: str, cost: CostModel, tp: int, cp: int, image_root: str | None, vision: VisionTokenConfig
) -> list[SampleWork]:
    if detect_format(path) == "raw_work":
        return read_raw_work_jsonl(path)
    return sample_works(read_samples(path, vision, image_root=image_root), cost, tp, cp)


def load_workload(
    name: str,
    cost: CostModel,
    *,
    global_batch: int,
    iterations: int,
    seed: int,
    tp: int = 1,
    cp: int = 1,
    shuffle: bool = False,
    image_root: str | None = None,
    vision: VisionTokenConfig = DEFAULT_VISION,
) -> Iterator[list[SampleWork]]:
    """One list of ``global_batch`` SampleWork per iteration.

    A built-in name draws samples ``[i*B, (i+1)*B)`` of ``(name, seed)`` for iteration ``i``
    (``curriculum``: of that iteration's phase, ``generators.batch_source``); a
    file is read in file order (shuffled with ``seed`` first if ``shuffle``) and iteration ``i`` uses
    its samples ``[i*B, (i+1)*B)``. ``image_root`` resolves a LLaVA file's relative image paths;
    ``vision`` holds the image processor's pixel limits (``--min-pixels`` / ``--max-pixels``).
    """
    _check_batching(global_batch, iterations)
    if is_builtin(name):
        if seed < 0:
            raise ConfigError(f"--seed must be >= 0 for the built-in datasets, got {seed}")
        return _builtin_batches(canonical_name(name), cost, global_batch, iterations, seed, tp, cp, vision)
    path = resolve_dataset_file(name)
    works = _file_works(path, cost, tp, cp, image_root, vision)
    need = global_batch * iterations
    if len(works) < need:
        raise ConfigError(
            f"{path}: has {len(works)} samples but --global-batch {global_batch} x --iterations {iterations} "
            f"needs {need}"
        )
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(works))
        works = [works[i] for i in order]
    return iter([works[i * global_batch : (i + 1) * global_batch] for i in range(iterations)])


def _builtin_batches(
    name: str,
    cost: CostModel,
    global_batch: int,
    iterations: int,
    seed: int,
    tp: int,
    cp: int,
    vision: VisionTokenConfig = DEFAULT_VISION,
) -> Iterator[list[SampleWork]]:
    memo: dict = {}
    for i in range(iterations):
        source = batch_source(name, i, iterations)
        samples = generate_samples(source, global_batch, seed, start=i * global_batch, vision=vision)
        yield sample_works(samples, cost, tp, cp, memo)
