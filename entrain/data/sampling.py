"""The one profiling sampler: Algorithm 1's draws for ``plan``, ``simulate`` and ``bench``.

``dataset_sampler(dataset, seed)`` returns ``sampler(n, draw_seed) -> samples``: ``n`` i.i.d. draws
with replacement (``costs.sampler.pool_sampler``) from the dataset's population. A built-in generator's
population is its first ``POOL_SIZE`` samples of ``seed``; a file's is every sample in it. These
commands build their sampler here, so the same ``--dataset`` and ``--seed`` give the same draws and
the same ``b_min`` in each (``train``'s b_min warning still draws from its own smaller pool).
"""

from __future__ import annotations

from entrain.core.costs.sampler import Sampler, pool_sampler
from entrain.core.errors import ConfigError
from entrain.core.workload.samples import DEFAULT_VISION, VisionTokenConfig
from entrain.data.generators import generate_samples, is_builtin
from entrain.data.workload_io import detect_format, read_raw_work_jsonl, read_samples, resolve_dataset_file
from entrain.data.workload_table import read_workload_table

__all__ = ["POOL_SIZE", "dataset_sampler"]

POOL_SIZE = 1 << 16
"""Samples of a built-in generator that make up the population Algorithm 1 draws from."""


def dataset_sampler(
    dataset: str, seed: int, *, image_root: str | None = None, vision: VisionTokenConfig = DEFAULT_VISION
) -> Sampler:
    """i.i.d. draws (with replacement) from the dataset named by ``--dataset``, its images resized
    under ``vision``'s pixel limits (``--min-pixels`` / ``--max-pixels``)."""
    if is_builtin(dataset):
        if seed < 0:
            raise ConfigError(f"--seed must be >= 0 for the built-in datasets, got {seed}")
        return pool_sampler(generate_samples(dataset, POOL_SIZE, seed, vision=vision))
    path = resolve_dataset_file(dataset)
    fmt = detect_format(path)
    if fmt == "raw_work":
        return pool_sampler(read_raw_work_jsonl(path))
    if fmt == "workload":  # streamed into columns: no Python object per record (docs/planning_scale.md)
        return pool_sampler(read_workload_table(path, vision))
    return pool_sampler(read_samples(path, vision, image_root=image_root))
