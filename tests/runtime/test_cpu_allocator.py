"""``keep_freed_memory``: ten 4 MiB tensors come from the heap and, freed, stay in the process for
the next step, while ``ENTRAIN_KEEP_FREED_MEMORY=0`` leaves glibc's defaults, which map such blocks
per use and give them back (read from glibc's ``mallinfo2``: allocator state, not time)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")

PROBE = """
import ctypes, torch
from entrain.runtime.cpu_allocator import keep_freed_memory
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
configured = keep_freed_memory()
tensors = [torch.ones(2**20) for _ in range(10)]  # 4 MiB each
mapped = libc.mallinfo2().hblkhd
del tensors
print(configured, mapped, libc.mallinfo2().fordblks)
"""

MIB = 2**20


def _probe(switch: str) -> tuple[bool, int, int]:
    """(configured, bytes in mapped blocks while the tensors live, free bytes kept after they go)."""
    env = {**os.environ, "ENTRAIN_KEEP_FREED_MEMORY": switch, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    if "mallinfo2" in out.stderr:
        pytest.skip("glibc without mallinfo2")
    assert out.returncode == 0, out.stderr
    configured, mapped, kept = out.stdout.split()
    return configured == "True", int(mapped), int(kept)


def test_freed_memory_is_kept_for_the_next_step():
    kept, kept_mapped, kept_free = _probe("1")
    default, default_mapped, default_free = _probe("0")
    assert kept and not default
    assert default_mapped >= 40 * MIB and default_free < 8 * MIB  # mapped per use, given back
    assert kept_mapped < 16 * MIB and kept_free >= 40 * MIB  # from the heap, kept
