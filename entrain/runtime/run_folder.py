"""A run folder (``--out``): which folder each system trains into, what makes a folder hold a run,
and the files rank 0 keeps there (``config.json``, ``metrics.jsonl``, ``plan.json``).

A folder holding a run is refused unless ``--resume`` continues it or ``--overwrite`` replaces it; a
resumed run keeps the metrics rows of the steps before it continues and appends the new ones.
"""

from __future__ import annotations

import json
import os
from typing import IO

from entrain.config import RunConfig
from entrain.core.errors import ConfigError

RUN_MARKERS = ("config.json", "metrics.jsonl", "checkpoints")
"""What makes a folder hold a run."""
METRICS = "metrics.jsonl"


def system_out(spec: RunConfig, system: str) -> str:
    return spec.run.out if len(spec.schedule.systems) == 1 else os.path.join(spec.run.out, system)


def write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def history(metrics_path: str, start: int) -> list[dict]:
    """Metrics rows of the steps before ``start`` (a resumed run keeps them, drops later ones)."""
    if start == 0 or not os.path.exists(metrics_path):
        return []
    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r["step"] < start]


def open_metrics(metrics_path: str, kept: list[dict]) -> IO[str]:
    """``metrics.jsonl`` for appending: the ``kept`` rows replace the file atomically first."""
    tmp = metrics_path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(tmp, metrics_path)
    return open(metrics_path, "a")  # noqa: SIM115 - the caller closes it


def check_run_folder(spec: RunConfig, overwrite: bool) -> None:
    """Refuse an ``--out`` that holds a run, unless ``--resume`` continues it or ``--overwrite``
    replaces it (a second run must not delete the first one's checkpoints by accident)."""
    if spec.run.resume or overwrite:
        return
    for out in dict.fromkeys([spec.run.out, *(system_out(spec, s) for s in spec.schedule.systems)]):
        held = [m for m in RUN_MARKERS if os.path.exists(os.path.join(out, m))]
        if held:
            raise ConfigError(
                f"--out {out} holds a run ({', '.join(held)}): pass --resume to continue it, --overwrite to "
                "replace it, or choose another --out"
            )


def interrupted_line(spec: RunConfig, how: str = "interrupted") -> str:
    """``interrupted at step N; continue with --resume`` (``how``: how the run was stopped): N = the
    steps the interrupted system completed (rows in its ``metrics.jsonl``)."""
    done = 0
    for system in spec.schedule.systems:
        path = os.path.join(system_out(spec, system), METRICS)
        try:
            with open(path, encoding="utf-8") as f:
                done = sum(1 for line in f if line.strip())
        except OSError:
            done = 0
        if done < spec.run.steps:
            break
    return f"{how} at step {done}; continue with --resume"
