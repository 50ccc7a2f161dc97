"""Idle check shared by the benchmarks that measure wall-clock time on this machine."""

from __future__ import annotations

import time


def cpu_idle_fraction(interval_s: float = 2.0) -> float:
    """Fraction of all cores' time spent idle (idle + iowait) over ``interval_s``, from /proc/stat."""

    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)

    idle0, total0 = read()
    time.sleep(interval_s)
    idle1, total1 = read()
    return (idle1 - idle0) / max(1, total1 - total0)
