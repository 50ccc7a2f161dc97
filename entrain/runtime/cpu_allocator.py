"""Keep freed host memory in the process (glibc ``malloc``), so a training step does not page-fault.

PyTorch's CPU tensors come from ``malloc``. By default glibc serves a large block (above a threshold
that adapts to the blocks freed, up to 32 MiB) with fresh ``mmap`` pages and gives them back on
``free``, and it trims the heap's free top back to the system once it exceeds twice that threshold:
a training step frees its activations, so the next one touches new pages again and the kernel zeroes
each on its first touch. On this project's CPU runs the same packed LLM microbatch took longer
inside training than alone (docs/profiling.md has the measurement). A CUDA caching allocator keeps
device memory for the same reason.

``keep_freed_memory`` fixes the ``mmap`` threshold at its 32 MiB maximum, keeps a 64 MiB pad on top
of the heap and turns trimming off (``mallopt``), so below 32 MiB the heap grows to the step's peak
once and is reused from then on (larger blocks are still mapped per use). ``entrain train`` workers
and ``entrain profile`` call it, so the profile is measured in the regime the runs execute in. It is
a no-op where the C library has no ``mallopt`` (not glibc) and when ``ENTRAIN_KEEP_FREED_MEMORY=0``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["keep_freed_memory", "ENV_SWITCH"]

ENV_SWITCH = "ENTRAIN_KEEP_FREED_MEMORY"
"""``0`` leaves ``malloc`` at its defaults (for side-by-side measurements)."""

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_SETTINGS = (
    (_M_MMAP_THRESHOLD, 32 * 2**20),  # glibc's largest; fixing it stops the adaptation
    (_M_TOP_PAD, 64 * 2**20),
    (_M_TRIM_THRESHOLD, 2**31 - 1),  # mallopt takes an int: never trim below 2 GiB of free top
)


def keep_freed_memory() -> bool:
    """Configure glibc ``malloc`` to keep freed memory; True when it was configured."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in _SETTINGS)
