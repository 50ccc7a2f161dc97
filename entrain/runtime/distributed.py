"""Process groups and the device, from the environment (CUDA + NCCL when available, else CPU + gloo).

Nothing here hard-codes a device: ``device_from_env`` picks the GPU of ``LOCAL_RANK`` when torch sees
one GPU per process of this node, the one GPU it sees when a launcher gives each process its own
(``CUDA_VISIBLE_DEVICES`` naming one GPU: device 0, whatever ``LOCAL_RANK``), else the CPU. The rule
(``choose_device``, one per node, the same in every process) for ``ENTRAIN_DEVICE`` (``entrain train
--device``; unset = ``auto``):

* ``cpu``: CPU + gloo, whatever is visible (the test suite sets it: CPU tests never pick NCCL);
* ``auto``: CUDA + NCCL when the node has at least as many GPUs as processes (``LOCAL_WORLD_SIZE``),
  or this process sees exactly the one GPU ``CUDA_VISIBLE_DEVICES`` names; more processes than GPUs
  falls back to CPU + gloo, with a one-line note (NCCL refuses two processes on one GPU);
* ``cuda``: one GPU per process, or a one-line error saying how many GPUs the node's processes need
  (or that none is usable).

``init_distributed`` reads torchrun's ``RANK``/``WORLD_SIZE`` (or takes them, with an ``init_method``,
for forked test workers).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from entrain.core.errors import ConfigError
from entrain.core.ir.plan import Layout

__all__ = [
    "DistEnv",
    "DEVICE_CHOICES",
    "DEVICE_ENV",
    "choose_device",
    "node_device",
    "own_gpu_only",
    "device_from_env",
    "init_distributed",
    "set_deterministic",
    "check_runtime_layout",
    "shutdown",
]


@dataclass(frozen=True, slots=True)
class DistEnv:
    rank: int
    world_size: int
    device: torch.device
    backend: str


DEVICE_ENV = "ENTRAIN_DEVICE"
"""``auto`` (unset), ``cuda`` or ``cpu``: the device rule of ``choose_device``."""
DEVICE_CHOICES = ("auto", "cuda", "cpu")


def choose_device(
    requested: str, num_local_procs: int, num_gpus: int, own_gpu: bool = False
) -> tuple[str, str | None]:
    """``(device type, note or None)`` for ``num_local_procs`` processes on a node with ``num_gpus``
    visible GPUs (module docstring; ``own_gpu``: ``CUDA_VISIBLE_DEVICES`` names this process's one
    GPU, ``own_gpu_only``); ConfigError for ``cuda`` without one GPU per process."""
    if requested not in DEVICE_CHOICES:
        raise ConfigError(f"{DEVICE_ENV}={requested!r}; choose from {', '.join(DEVICE_CHOICES)}")
    if requested == "cpu" or (requested == "auto" and num_gpus == 0):
        return "cpu", None
    if num_gpus >= num_local_procs or (num_gpus == 1 and own_gpu):
        return "cuda", None
    need = (
        f"{num_local_procs} processes on this node need {num_local_procs} GPUs (one each), {num_gpus} visible"
    )
    if requested == "cuda" and num_gpus == 0:
        raise ConfigError("--device cuda: no GPU is visible (none that torch can use on this node)")
    if requested == "cuda":
        raise ConfigError(
            f"--device cuda: {need}; start at most {num_gpus} processes per node, or use --device cpu"
        )
    return "cpu", (
        f"entrain train: note: {need}: running on CPU with gloo (--device cuda refuses this; a launcher "
        "that gives each process its own GPU sets CUDA_VISIBLE_DEVICES to it)"
    )


def local_process_count() -> int:
    """Processes of this node: torchrun's ``LOCAL_WORLD_SIZE`` (1 when started alone)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def visible_gpus() -> int:
    """GPUs this process can use (0 where CUDA is missing or unusable)."""
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except RuntimeError:  # a broken driver: no usable GPU
        return 0


def own_gpu_only() -> bool:
    """Whether ``CUDA_VISIBLE_DEVICES`` names exactly one GPU (a launcher that shows each process its
    own GPU sets it so)."""
    names = [n for n in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if n.strip()]
    return len(names) == 1


def node_device(requested: str, num_local_procs: int) -> tuple[str, str | None]:
    """``choose_device`` with what this process sees."""
    return choose_device(requested, num_local_procs, visible_gpus(), own_gpu_only())


def device_from_env() -> torch.device:
    """This process's device under ``choose_device``'s rule (``ENTRAIN_DEVICE``, ``LOCAL_RANK``): the
    GPU of its local rank, or device 0 where it sees one GPU (its own, or the node's only one)."""
    requested = os.environ.get(DEVICE_ENV, "auto")
    if requested == "cpu":  # no CUDA query at all (forked test workers)
        return torch.device("cpu")
    kind, _ = node_device(requested, local_process_count())
    if kind == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", 0 if visible_gpus() == 1 else int(os.environ.get("LOCAL_RANK", "0")))


CUBLAS_WORKSPACE = ":4096:8"
"""``CUBLAS_WORKSPACE_CONFIG`` that makes cuBLAS deterministic (read when its first handle is made)."""


def set_deterministic(enabled: bool) -> None:
    """``--deterministic``: torch's deterministic algorithms (an op without one raises), cuDNN's
    deterministic kernels without autotuning, and cuBLAS's fixed workspace. Call before CUDA work."""
    if not enabled:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def init_distributed(
    *,
    timeout_s: float = 120.0,
    rank: int | None = None,
    world_size: int | None = None,
    init_method: str | None = None,
) -> DistEnv:
    """Start the default process group (once); the backend follows the device."""
    device = device_from_env()
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        kwargs = {"timeout": timedelta(seconds=timeout_s)}
        if init_method is not None:
            kwargs.update(init_method=init_method, rank=rank, world_size=world_size)
        if backend == "nccl":
            kwargs["device_id"] = device
        dist.init_process_group(backend, **kwargs)
    return DistEnv(dist.get_rank(), dist.get_world_size(), device, backend)


def check_runtime_layout(layout: Layout, world_size: int | None = None, tp: int = 1) -> None:
    """Refuse what this runtime cannot execute, before any process group starts: CP above 1, a TP
    degree other than ``tp`` (every component runs at the one ``--tp``), or a process count other
    than the Plan's ranks times ``tp`` (``world_size``: plan ranks)."""
    for name, comp in sorted(layout.components.items()):
        if comp.cp > 1:
            raise ConfigError(
                f"the runtime executes Plans with CP = 1; the {name} has CP = {comp.cp} "
                f"(the planner and simulator cover it)"
            )
        if comp.tp != tp:
            raise ConfigError(
                f"the {name} has TP = {comp.tp} in the Plan but the run uses --tp {tp}; the runtime runs "
                "every component at one TP degree"
            )
    if world_size is not None and layout.world_size != world_size:
        raise ConfigError(
            f"the Plan needs {layout.world_size * tp} processes (dp {layout.dp} x {layout.ranks_per_replica} "
            f"pipeline ranks x tp {tp}) but {world_size * tp} were started"
        )


def shutdown() -> None:
    """Barrier, then destroy the default group (pending sends must have been waited on)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
