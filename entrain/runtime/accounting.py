"""Which samples each training step uses, and where a run stands in its data (epochs, offsets).

A file dataset is an *epoch stream*: epoch ``e`` is an ordering of the valid training samples (file
order, or a permutation seeded by ``(seed, e)`` with ``--shuffle``; epoch 0 with ``--shuffle`` is
``numpy.random.default_rng(seed).permutation``), and the epochs are laid end to end. Step ``i``
trains the stream's samples ``[i*B, (i+1)*B)``. So every valid sample is trained exactly once per
epoch, a remainder smaller than the global batch ``B`` is completed by the next epoch's first samples
that it does not already hold (never dropped, never padded, never twice in one batch), and the data position of a checkpoint is simply the step count. A
built-in generator is an endless stream (one "epoch"). Plans are hashed per iteration
(``plan_hash``) so two runs can be compared step by step. No torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from entrain.core.errors import ConfigError
from entrain.core.ir.plan import IterationPlan
from entrain.core.workload.work import SampleWork

__all__ = ["DataPosition", "EpochStream", "plan_hash"]


@dataclass(frozen=True, slots=True)
class DataPosition:
    """Where the stream stands after ``step`` steps of ``global_batch`` samples."""

    step: int
    samples_consumed: int
    epoch: int
    offset_in_epoch: int
    """Samples of ``epoch`` already trained."""

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "samples_consumed": self.samples_consumed,
            "epoch": self.epoch,
            "offset_in_epoch": self.offset_in_epoch,
        }


@dataclass(frozen=True)
class EpochStream:
    """The training samples of a file dataset, epoch after epoch."""

    works: tuple[SampleWork, ...]
    seed: int
    shuffle: bool

    def __post_init__(self) -> None:
        if not self.works:
            raise ConfigError("the dataset has no training samples left (after held-out validation batches)")

    @property
    def epoch_size(self) -> int:
        return len(self.works)

    def order(self, epoch: int) -> list[int]:
        n = len(self.works)
        if not self.shuffle:
            return list(range(n))
        rng = np.random.default_rng(self.seed if epoch == 0 else [self.seed, epoch])
        return rng.permutation(n).tolist()

    def batches(self, global_batch: int, steps: int) -> list[list[SampleWork]]:
        """Steps ``0 .. steps-1``: ``global_batch`` consecutive samples of the stream each. A batch that
        spans an epoch boundary takes the next epoch's first samples that are not already in it (a
        sample appears at most once per global batch; the next epoch's order is otherwise kept)."""
        if global_batch > self.epoch_size:
            raise ConfigError(
                f"--global-batch {global_batch} is larger than the dataset's {self.epoch_size} training "
                f"samples: a global batch would hold a sample twice; use --global-batch {self.epoch_size} or less"
            )
        out: list[list[SampleWork]] = []
        flat: list[int] = []
        epoch = 0
        need = global_batch * steps
        while len(flat) < need:
            order = self.order(epoch)
            partial = set(flat[len(flat) - len(flat) % global_batch :])
            if partial:
                fill = global_batch - len(partial)
                head = [i for i in order if i not in partial][:fill]
                taken = set(head)
                order = head + [i for i in order if i not in taken]
            flat.extend(order)
            epoch += 1
        flat_works = [self.works[i] for i in flat]
        for i in range(steps):
            out.append(flat_works[i * global_batch : (i + 1) * global_batch])
        return out

    def position(self, step: int, global_batch: int) -> DataPosition:
        done = step * global_batch
        epoch, offset = divmod(done, self.epoch_size)
        return DataPosition(step, done, epoch, offset)


def endless_position(step: int, global_batch: int) -> DataPosition:
    """A generator's data position (one endless epoch)."""
    return DataPosition(step, step * global_batch, 0, step * global_batch)


def plan_hash(it: IterationPlan) -> str:
    """First 16 hex digits of the sha256 of the iteration's canonical JSON (microbatches and actions)."""
    text = json.dumps(it.to_json(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def split_validation(
    works: Sequence[SampleWork], global_batch: int, val_batches: int
) -> tuple[list[SampleWork], list[list[SampleWork]]]:
    """Hold out the file's last ``val_batches * global_batch`` samples (never trained)."""
    num_val = global_batch * val_batches
    if num_val and num_val >= len(works):
        raise ConfigError(
            f"--val-batches {val_batches} x --global-batch {global_batch} = {num_val} held-out samples leave "
            f"none of the dataset's {len(works)} samples for training; use fewer --val-batches"
        )
    train = list(works[: len(works) - num_val])
    val = list(works[len(works) - num_val :])
    return train, [
        val[i * global_batch : (i + 1) * global_batch] for i in range(val_batches if num_val else 0)
    ]
