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
    "build_dp_groups",
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


def check_runtime_layout(layout: Layout, world_size: int | None = None) -> None:
    """Refuse what this runtime cannot execute, before any process group starts."""
    for name, comp in sorted(layout.components.items()):
        for degree_name, degree in (("TP", comp.tp), ("CP", comp.cp)):
            if degree > 1:
                raise ConfigError(
                    f"the runtime executes Plans with TP = CP = 1; the {name} has {degree_name} = {degree} "
                    f"(the planner and simulator cover it)"
                )
    if world_size is not None and layout.world_size != world_size:
        raise ConfigError(
            f"the Plan needs {layout.world_size} processes (dp {layout.dp} x {layout.ranks_per_replica} "
            f"pipeline ranks) but {world_size} were started"
        )


def build_dp_groups(layout: Layout, timeout_s: float | None = None) -> dict[int, dist.ProcessGroup | None]:
    """Per pipeline rank, the DP group of its replicas (None when dp = 1). Every rank must call this.
    ``timeout_s``: the groups' collective timeout (``new_group`` does not inherit the default group's)."""
    groups: dict[int, dist.ProcessGroup | None] = {}
    kwargs = {"timeout": timedelta(seconds=timeout_s)} if timeout_s is not None else {}
    for pp in range(layout.ranks_per_replica):
        ranks = [layout.global_rank(r, pp) for r in range(layout.dp)]
        groups[pp] = dist.new_group(ranks, **kwargs) if layout.dp > 1 else None
    return groups


def shutdown() -> None:
    """Barrier, then destroy the default group (pending sends must have been waited on)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
