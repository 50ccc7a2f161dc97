"""Host-to-device copies of the rendered inputs.

On a GPU, a microbatch's tensors go through pinned (page-locked) host memory and are copied with
``non_blocking=True``, so the copy is a DMA that does not stall the host. ``InputPrefetcher``
copies the *next* forward's inputs on a side stream while the current forward computes: the step's
forwards are announced in order (``expect``); taking one makes the compute stream wait for its
copy's event (and records the tensors' use on that stream for the caching allocator), then starts
the next one's copy. An input asked for out of the announced order is simply built on the spot.
On the CPU nothing of this happens: tensors are made where they are used, as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import fields, is_dataclass

import torch

__all__ = ["host_to_device", "InputPrefetcher"]


def host_to_device(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` on ``device`` (in ``dtype``): on CUDA from pinned memory without blocking the host (the
    cast runs on the device, after the copy); elsewhere a plain ``.to``."""
    if device.type != "cuda":
        return t.to(device, dtype)
    out = t.pin_memory().to(device, non_blocking=True)
    return out if dtype is None or out.dtype == dtype else out.to(dtype)


def _tensors(value) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif is_dataclass(value):
        for f in fields(value):
            yield from _tensors(getattr(value, f.name))
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


class InputPrefetcher:
    """The next announced input, copied on a side stream (module docstring); a pass-through on
    anything but CUDA."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._queue: deque[tuple[Hashable, Callable[[], object]]] = deque()
        self._ready: tuple[Hashable, object, object] | None = None

    def expect(self, inputs: list[tuple[Hashable, Callable[[], object]]]) -> None:
        """The step's inputs ``(key, build)`` in the order they will be taken; starts the first copy."""
        if self.stream is None:
            return
        self._queue = deque(inputs)
        self._ready = None
        self._start_next()

    def take(self, key: Hashable, build: Callable[[], object]):
        """The input ``key``: the prefetched one when it is next (the compute stream waits for its
        copy, then the following copy starts), else ``build()`` now."""
        if self._ready is None or self._ready[0] != key:
            return build()
        _, value, copied = self._ready
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(copied)
        for t in _tensors(value):
            if t.is_cuda:
                t.record_stream(compute)  # made on the side stream, used and freed on this one
        self._ready = None
        self._start_next()
        return value

    def _start_next(self) -> None:
        if not self._queue:
            return
        key, build = self._queue.popleft()
        with torch.cuda.stream(self.stream):
            value = build()
            copied = torch.cuda.Event()
            copied.record(self.stream)
        self._ready = (key, value, copied)
