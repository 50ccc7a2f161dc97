"""Process groups and the device, from the environment (CUDA + NCCL when available, else CPU + gloo).

Nothing here hard-codes a device: ``device_from_env`` picks CUDA when torch sees a GPU (the GPU of
``LOCAL_RANK``), else the CPU. ``init_distributed`` reads torchrun's ``RANK``/``WORLD_SIZE`` (or takes
them, with an ``init_method``, for forked test workers).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from entrain.core.errors import ConfigError
from entrain.core.plan import Layout

__all__ = [
    "DistEnv",
    "device_from_env",
    "init_distributed",
    "check_runtime_layout",
    "shutdown",
]


@dataclass(frozen=True, slots=True)
class DistEnv:
    rank: int
    world_size: int
    device: torch.device
    backend: str


def device_from_env() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


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
