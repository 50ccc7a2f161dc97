"""Where Algorithm 1's profiling samples come from, per ``--dataset``: the ``Sampler``
(``entrain.core.planner``) that ``plan``, ``simulate``, ``bench`` and ``train`` hand to the planner."""

from __future__ import annotations

from collections.abc import Sequence

from entrain.core.errors import ConfigError
from entrain.core.planner import Sampler, pool_sampler
from entrain.core.work import SampleWork

__all__ = ["POOL_SIZE", "dataset_sampler", "pool_sampler_for"]

POOL_SIZE = 1 << 15
"""Samples of a built-in generator that ``plan`` draws its profiling batches from."""


def dataset_sampler(dataset: str, batches: Sequence[Sequence[SampleWork]]) -> Sampler:
    """Built-in generators draw fresh i.i.d. samples; a file's samples (the run's ``batches``) form
    the pool."""
    from entrain.data.generators import is_builtin, random_samples

    if is_builtin(dataset):
        return lambda n, seed: random_samples(dataset, n, seed)
    return pool_sampler([s.meta if s.meta is not None else s for b in batches for s in b])


def pool_sampler_for(dataset: str, seed: int, image_root: str | None = None) -> Sampler:
    """i.i.d. draws from a pool of the dataset named by ``--dataset``: ``POOL_SIZE`` samples of a
    built-in generator (of ``seed``), or a file's samples."""
    from entrain.data.generators import generate_samples, is_builtin
    from entrain.data.workload_io import (
        detect_format,
        read_raw_work_jsonl,
        read_samples,
        resolve_dataset_file,
    )

    if is_builtin(dataset):
        if seed < 0:
            raise ConfigError(f"--seed must be >= 0 for the built-in datasets, got {seed}")
        return pool_sampler(generate_samples(dataset, POOL_SIZE, seed))
    path = resolve_dataset_file(dataset)
    if detect_format(path) == "raw_work":
        return pool_sampler(read_raw_work_jsonl(path))
    return pool_sampler(read_samples(path, image_root=image_root))
