"""``entrain train --tensorboard``: rank 0 writes each step's scalars to ``OUT/tensorboard/`` through
``torch.utils.tensorboard`` (the ``tensorboard`` package, in the ``train`` extra).

Tags: ``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/iteration_ms``, ``train/tokens_per_s``,
``train/stage_std_ms`` (``entrain.runtime.run_metrics.stage_std_ms``), ``val/loss`` when validated, and
``data/skipped_samples`` (records left out by ``--on-bad-sample skip``), at the step index.
"""

from __future__ import annotations

import importlib.util
import os

from entrain.core.errors import ConfigError

__all__ = ["ScalarLog", "check_tensorboard", "TAGS"]

TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "iteration_time_ms": "train/iteration_ms",
    "tokens_per_s": "train/tokens_per_s",
    "stage_std_ms": "train/stage_std_ms",
    "val_loss": "val/loss",
    "skipped_samples": "data/skipped_samples",
}
"""metrics.jsonl key (or computed value) -> TensorBoard tag."""


def check_tensorboard() -> None:
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard needs the 'tensorboard' package: pip install tensorboard")


class ScalarLog:
    def __init__(self, out: str, purge_step: int | None = None):
        check_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(out, "tensorboard"), purge_step=purge_step)

    def write(self, step: int, values: dict) -> None:
        for key, tag in TAGS.items():
            value = values.get(key)
            if value is not None:
                self.writer.add_scalar(tag, float(value), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
