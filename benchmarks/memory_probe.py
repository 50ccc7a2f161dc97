"""The memory lever, measured: Entrain on a case as it runs, and again with device memory unlimited.

The ceiling's bounds (``ceiling.py``, ``layer_bound.py``) leave the memory limit out. Where Entrain's plan
recomputes, its time stays far above the contiguous figure. This probe measures how much of that gap the
device memory accounts for: it runs Entrain (``entrain simulate``'s path, every decision Entrain takes) twice
on the case's first iteration, side by side:

* ``preset``: on the case's own cost model (its hardware preset's device memory, 48 GB on a40-paper);
* ``unlimited``: on the same cost model with ``HardwareSpec.device_memory_bytes`` raised to
  ``UNLIMITED_BYTES``, passed as a measured profile (``--profile``, ``CostModel.save``), so every memory check,
  recomputation decision and eager budget sees memory that never binds. Nothing else changes: the same
  samples (checked), degrees, costs and decisions.

``python benchmarks/memory_probe.py --case KEY ... --out FILE.json`` probes ceiling.py's cases (runs in
parallel write their own files); ``ceiling.py --layers results/ceiling.json --memory-from FILE.json ...``
attaches them to the whole-layer section's rows (``ceiling.attach_memory``) and renders their table
(``layer_bound.memory_probe_lines``), re-running nothing. One iteration
(the first of the case's batches), not the case's three, to keep the two runs cheap; the contiguous figure
beside them is that iteration's (``layer_bound``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import ceiling
import layer_bound
from provenance import source

from entrain.cli.common import resolve_cost_model, workload_source
from entrain.cli.main import build_parser
from entrain.cli.simulate import simulate_systems

UNLIMITED_BYTES = 1e15
"""Device memory no plan of the zoo comes near (1 PB)."""


def _one_iteration(argv: list[str]) -> list[str]:
    out = list(argv)
    if "--iterations" in out:
        out[out.index("--iterations") + 1] = "1"
    else:
        out += ["--iterations", "1"]
    return out


def _with_profile(argv: list[str], profile: str) -> list[str]:
    """``argv`` with its hardware preset (or profile) replaced by the measured profile ``profile``."""
    out = list(argv)
    for flag in ("--hardware", "--profile"):
        if flag in out:
            i = out.index(flag)
            del out[i : i + 2]
    return [*out, "--profile", profile]


def _entrain(argv: list[str]) -> dict:
    args = build_parser().parse_args(argv)
    runs, configs = simulate_systems(args, ["entrain"])
    run = runs["entrain"]
    return {
        "iteration_time_ms": run.metrics.iteration_time_ms,
        "busiest_rank_ms": layer_bound.busiest_rank_ms(run),
        "fits_memory": run.metrics.fits_memory,
        "peak_memory_bytes": max(run.metrics.peak_memory_bytes_per_rank or [0.0]),
        "recompute": sorted({s.recompute for s in run.layout.stages}),
        "layout": [(s.component, s.first_layer, s.end_layer, s.pp_rank) for s in run.layout.stages],
        "samples": sorted(run.plan.samples),
    }


def probe(argv: list[str], contiguous_ms: float) -> dict:
    """Entrain on ``argv``'s (a ``simulate`` command line) first iteration, on its preset and with memory
    unlimited; ``contiguous_ms``: that iteration's contiguous figure (``layer_bound``)."""
    one = _one_iteration(argv)
    cost = resolve_cost_model(build_parser().parse_args(one))
    unlimited = replace(cost, hardware=replace(cost.hardware, device_memory_bytes=UNLIMITED_BYTES))
    preset = _entrain(one)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "unlimited.json")
        unlimited.save(path)
        lifted = _entrain(_with_profile(one, path))
    if preset.pop("samples") != lifted.pop("samples"):
        raise SystemExit("memory probe: the run with memory unlimited drew other samples")
    return {
        "contiguous_ms": contiguous_ms,
        "device_memory_bytes": cost.hardware.device_memory_bytes,
        "preset": preset,
        "unlimited": lifted,
    }


def probe_case(argv: list[str]) -> dict:
    """``probe`` on ``argv``'s case, beside its first iteration's contiguous figure."""
    args = build_parser().parse_args(_one_iteration(argv))
    cost = resolve_cost_model(args)
    batch = next(iter(workload_source(args, cost).batches(args.global_batch, 1)))
    figure = layer_bound.iteration_layer_bounds(batch, cost, gpus=args.gpus, dp=args.dp or 1, tp=args.tp)
    return probe(argv, figure["contiguous_ms"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", action="append", required=True, help="a ceiling.py case key (repeatable)")
    p.add_argument("--out", required=True, help="the JSON file to write")
    args = p.parse_args(argv)
    every = ceiling.all_cases()
    unknown = [k for k in args.case if k not in every]
    if unknown:
        raise SystemExit(f"memory probe: unknown case(s) {', '.join(unknown)}")
    out = {"source": source(), "cases": {}}
    t0 = time.perf_counter()
    for key in args.case:
        print(f"memory probe: {key} ...", file=sys.stderr, flush=True)
        out["cases"][key] = probe_case(every[key]["argv"])
        out["elapsed_s"] = time.perf_counter() - t0
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")  # after every case
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
