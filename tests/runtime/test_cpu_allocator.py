"""``keep_freed_memory``: a step's freed tensors (ten 4 MiB ones) are reused by the next step, not
faulted in again (counted in page faults, not time), and ``ENTRAIN_KEEP_FREED_MEMORY=0`` leaves
malloc at its defaults, which trim them away."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")

PROBE = """
import resource, torch
from entrain.runtime.cpu_allocator import keep_freed_memory
configured = keep_freed_memory()
def step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tensors = [torch.ones(2**20) for _ in range(10)]  # 4 MiB each
    del tensors
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
step(), step()
print(configured, step())
"""


def _third_step_faults(switch: str) -> tuple[bool, int]:
    env = {**os.environ, "ENTRAIN_KEEP_FREED_MEMORY": switch, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    configured, faults = out.stdout.split()
    return configured == "True", int(faults)


def test_freed_memory_is_reused_without_page_faults():
    kept, kept_faults = _third_step_faults("1")
    default, default_faults = _third_step_faults("0")
    assert kept and not default
    assert default_faults > 2000  # 40 MiB of fresh 4 KiB pages (fewer with huge pages)
    assert kept_faults < default_faults / 10
