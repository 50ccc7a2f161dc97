import os

# CPU tests run on CPU + gloo even where a GPU is visible (entrain.runtime.distributed.choose_device);
# a GPU test asks for CUDA itself (monkeypatch.setenv("ENTRAIN_DEVICE", "cuda"), or run with it set)
os.environ.setdefault("ENTRAIN_DEVICE", "cpu")
# one intra-op thread per test process (and the processes it starts), as a training worker has
# (entrain.cli.launch): the tests' tensors are tiny, and a second thread only contends with the forked
# ranks and the other process on a 2-core machine. Read by torch when it is first imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def gpu_skip_reason(num_gpus: int, needed: int) -> str | None:
    """Why a ``gpu`` test needing ``needed`` GPUs cannot run with ``num_gpus`` visible (None: it can)."""
    if num_gpus >= needed:
        return None
    if num_gpus == 0:
        return "gpu test: torch sees no CUDA device"
    return f"gpu test: needs {needed} CUDA devices, torch sees {num_gpus}"


def pytest_configure(config):
    """``-n 2 --dist loadfile`` hands the files out in collection order (``pytest_collection_modifyitems``'s
    order), not pytest-xdist's default (>= 3.7) of most tests first, which left the one-test multi-process
    files (tests/runtime/test_elastic.py, test_resume_multirank.py) to the end of the run: one worker ran
    them alone while the other had finished."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Files holding a ``@pytest.mark.slow`` or ``@pytest.mark.early`` test first (collection order
    otherwise: tests in a file keep theirs). Skip ``@pytest.mark.gpu`` tests (``@pytest.mark.gpu(min_gpus=2)``: multi-GPU) where torch sees
    too few CUDA devices; ``pytest -m gpu`` selects them. ``device_count`` asks NVML first, so the
    parent does not initialise CUDA (forked CPU workers stay usable)."""
    import pytest

    first = {item.path for item in items if {"slow", "early"} & {m.name for m in item.iter_markers()}}
    items.sort(key=lambda item: item.path not in first)
    marked = [(item, item.get_closest_marker("gpu")) for item in items]
    marked = [(item, mark) for item, mark in marked if mark is not None]
    if not marked:
        return
    import torch

    num_gpus = torch.cuda.device_count()
    for item, mark in marked:
        reason = gpu_skip_reason(num_gpus, mark.kwargs.get("min_gpus", 1))
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
