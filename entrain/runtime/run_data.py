"""The batches of a run: a built-in generator's, or a dataset file's (screened first when it is a LLaVA /
Parquet file, ``--on-bad-sample``), split into training steps and held-out validation batches, and the
real records the renderer draws images and text from."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from entrain.config import RunConfig
from entrain.core.costs.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.workload.work import SampleWork
from entrain.runtime.accounting import DataPosition, EpochStream, endless_position, split_validation

__all__ = ["RunData", "load_data", "record_source", "screen", "skipped_line"]


@dataclass
class RunData:
    """The batches of a run: training steps, held-out validation batches, and where they come from."""

    train: list[list[SampleWork]]
    val: list[list[SampleWork]]
    stream: EpochStream | None = None
    """The epoch stream of a file dataset (None for a built-in generator: one endless epoch)."""
    records: list | None = None
    """A LLaVA / Parquet dataset's usable records (rendered from the real images and text)."""
    skipped: str | None = None
    """``skipped N of M records; see OUT/skipped.jsonl`` when ``--on-bad-sample skip`` left some out."""
    num_skipped: int = 0
    """Records left out by ``--on-bad-sample skip`` (TensorBoard's ``data/skipped_samples``)."""

    def identity(self) -> dict | None:
        """A file dataset's training pool: sample count and sha256 of the ids in file order (a resume
        refuses a dataset that changed since the checkpoint); None for a built-in generator."""
        if self.stream is None:
            return None
        import hashlib

        ids = "\x1f".join(w.id for w in self.stream.works)
        return {
            "train_samples": self.stream.epoch_size,
            "ids_sha256": hashlib.sha256(ids.encode()).hexdigest(),
        }

    def position(self, step: int, global_batch: int) -> DataPosition:
        if self.stream is None:
            return endless_position(step, global_batch)
        return self.stream.position(step, global_batch)


def _check_meta(spec: RunConfig, works: Sequence[SampleWork]) -> None:
    for w in works:
        if w.meta is None:
            raise ConfigError(
                f"{spec.data.dataset}: sample {w.id!r} has no token metadata (a raw-work file); "
                "training needs images and text token counts"
            )


def screen(spec: RunConfig, out_dir: str | None, tokenizer=None):
    """``entrain.data.check.screen_dataset`` of a LLaVA / Parquet ``--dataset`` with
    ``--on-bad-sample``: ``error`` raises the report, ``skip`` writes ``out_dir/skipped.jsonl``
    (``out_dir`` None: a scratch folder, for the ranks that do not own the run folder)."""
    import shutil
    import tempfile

    from entrain.data.check import screen_dataset

    scratch = tempfile.mkdtemp(prefix="entrain-screen-") if out_dir is None else None
    try:
        return screen_dataset(
            spec.data.dataset,
            on_bad=spec.data.on_bad_sample,
            out_dir=out_dir or scratch,
            image_root=spec.data.image_root,
            confine_images=spec.data.confine_images,
            tokenizer=tokenizer,
            vision=spec.data.vision(spec.model),
            video=_video_settings(spec),
        )
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _video_settings(spec: RunConfig):
    """The model family's video processor numbers for the metadata of records with videos
    (``ModelFamily.video_settings_for`` of ``--model-path``; None for a family that reads no video)."""
    family = spec.model.family()
    hook = getattr(family, "video_settings_for", None)
    return (
        hook(spec.model.model_path) if hook is not None and getattr(family, "accepts_video", False) else None
    )


def load_data(spec: RunConfig, cost: CostModel, *, owner: bool = True, tokenizer=None) -> RunData:
    """Training and validation batches. A built-in generator: samples ``[i*B, (i+1)*B)`` for step
    ``i``, validation batches after the last step. A file: its last ``val_batches`` global batches
    are held out and the rest is an epoch stream (``entrain.runtime.accounting``). A LLaVA / Parquet
    file is screened first (``--on-bad-sample``); ``owner`` (rank 0) writes ``skipped.jsonl``."""
    from entrain.data.generators import is_builtin
    from entrain.data.workload_io import (
        detect_format,
        load_workload,
        read_raw_work_jsonl,
        read_workload_jsonl,
        resolve_dataset_file,
        sample_works,
    )

    num_val = spec.data.val_batches if spec.data.val_every > 0 else 0
    if is_builtin(spec.data.dataset):
        batches = list(
            load_workload(
                spec.data.dataset,
                cost,
                global_batch=spec.parallel.global_batch,
                iterations=spec.run.steps + num_val,
                seed=spec.data.seed,
                tp=spec.parallel.tp,
                image_root=spec.data.image_root,
                vision=spec.data.vision(spec.model),
            )
        )
        return RunData(batches[: spec.run.steps], batches[spec.run.steps :])
    path = resolve_dataset_file(spec.data.dataset)
    fmt = detect_format(path)
    records = skipped = None
    num_skipped = 0
    if fmt == "conversation":
        screened = screen(spec, spec.run.out if owner else None, tokenizer)
        works, records = sample_works(screened.samples, cost, tp=spec.parallel.tp), screened.records
        skipped = skipped_line(screened)
        if owner and skipped:
            print(f"entrain: {skipped}", file=sys.stderr, flush=True)
        num_skipped = screened.report.bad if skipped else 0
    elif fmt == "workload":
        works = sample_works(
            read_workload_jsonl(path, spec.data.vision(spec.model)), cost, tp=spec.parallel.tp
        )
    else:
        works = read_raw_work_jsonl(path)
    _check_meta(spec, works)
    train, val = split_validation(works, spec.parallel.global_batch, num_val)
    stream = EpochStream(tuple(train), spec.data.seed, spec.data.shuffle)
    return RunData(
        stream.batches(spec.parallel.global_batch, spec.run.steps), val, stream, records, skipped, num_skipped
    )


def skipped_line(screened) -> str | None:
    """``skipped N of M records; see PATH`` for a screening that left records out (None: none)."""
    report = screened.report
    if not report.bad or screened.skipped_path is None:
        return None
    return f"skipped {report.bad} of {report.records} records; see {screened.skipped_path}"


def record_source(spec: RunConfig, data: RunData, tokenizer=None):
    """The real samples (images and conversations) of a LLaVA / Parquet dataset; None for the built-in
    generators and workload files, whose samples are rendered from their metadata."""
    from entrain.runtime.record_source import RecordSource

    if data.records is None:
        return None
    return RecordSource(spec.data.dataset, spec.data.image_root, records=data.records, tokenizer=tokenizer)
