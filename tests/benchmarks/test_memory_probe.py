"""benchmarks/memory_probe.py: Entrain on a case as it runs and with device memory unlimited, side by side.
On a small case whose 16 GB (a measured profile's) make Entrain recompute, the probe's first run is the
case's own ``simulate``, and its second sees the same samples with memory that never binds: no
recomputation, every plan fitting."""

from __future__ import annotations

import importlib
from dataclasses import replace

from entrain.cli.main import build_parser
from entrain.cli.simulate import simulate_systems
from entrain.core.costs.presets import build_cost_model


def _argv(profile: str) -> list[str]:
    return ["simulate", "--dataset", "synthchartnet", "--model", "qwen25vl-llama3-1b", "--profile", profile,
            "--gpus", "8", "--dp", "2", "--tp", "1", "--global-batch", "16", "--microbatch-size", "2",
            "--iterations", "2"]  # fmt: skip


def test_the_probe_runs_the_case_and_again_with_memory_unlimited(benchmarks_on_path, tmp_path, monkeypatch):
    memory_probe = importlib.import_module("memory_probe")
    cost = build_cost_model("qwen25vl-llama3-1b", "a40-paper")
    small = str(tmp_path / "small.json")
    replace(cost, hardware=replace(cost.hardware, device_memory_bytes=16e9)).save(small)
    calls = []

    def spy(args, systems):
        runs, configs = simulate_systems(args, systems)
        calls.append((vars(args), systems, runs["entrain"].metrics.iteration_time_ms))
        return runs, configs

    monkeypatch.setattr(memory_probe, "simulate_systems", spy)
    got = memory_probe.probe(_argv(small), 1000.0)
    preset, lifted = got["preset"], got["unlimited"]
    assert got["device_memory_bytes"] == 16e9 and got["contiguous_ms"] == 1000.0
    # the first run is the case's own simulate (its parsed command line, Entrain alone), at one iteration
    one = build_parser().parse_args(memory_probe._one_iteration(_argv(small)))
    assert one.iterations == 1 and len(calls) == 2
    assert calls[0][:2] == (vars(one), ["entrain"]) and preset["iteration_time_ms"] == calls[0][2]
    assert preset["recompute"] != ["none"] and preset["peak_memory_bytes"] <= 16e9  # the case binds
    assert lifted["recompute"] == ["none"] and lifted["fits_memory"]
    assert lifted["peak_memory_bytes"] > 16e9  # what the plan holds once nothing stops it
    lines = importlib.import_module("layer_bound").memory_probe_lines(
        [{"case": "small", "memory_probe": got}]
    )
    assert lines[1] == "### Entrain with device memory unlimited"
    assert lines[-1].startswith(f"| small | 1000.0 | {preset['iteration_time_ms']:.1f} |")


def test_the_profile_replaces_the_preset_or_profile_given(benchmarks_on_path):
    memory_probe = importlib.import_module("memory_probe")
    argv = ["simulate", "--hardware", "a40-paper", "--iterations", "3"]
    assert memory_probe._with_profile(argv, "x.json") == [
        "simulate",
        "--iterations",
        "3",
        "--profile",
        "x.json",
    ]
    assert memory_probe._with_profile(["simulate", "--profile", "a.json"], "b.json") == [
        "simulate", "--profile", "b.json"
    ]  # fmt: skip
    assert memory_probe._one_iteration(argv)[-1] == "1" and memory_probe._one_iteration(["x"])[-2:] == [
        "--iterations", "1"
    ]  # fmt: skip


def test_probes_attach_to_the_whole_layer_rows_and_render(benchmarks_on_path):
    import pytest

    ceiling, layer_bound = importlib.import_module("ceiling"), importlib.import_module("layer_bound")
    run = {"iteration_time_ms": 1200.0, "busiest_rank_ms": 1000.0, "fits_memory": True,
           "peak_memory_bytes": 5e10, "recompute": ["none"], "layout": []}  # fmt: skip
    got = {"contiguous_ms": 1000.0, "device_memory_bytes": 48e9,
           "preset": {**run, "iteration_time_ms": 1500.0, "recompute": ["full", "none"]}, "unlimited": run}  # fmt: skip
    res = {"sources": [{"commit": "a"}], "layer_bound": {"cases": [{"case": "x/1B"}, {"case": "y/1B"}]}}
    probes = [{"source": {"commit": "b"}, "cases": {"x/1B": got}}]
    out = ceiling.attach_memory(res, probes)
    assert (
        out["layer_bound"]["cases"][0]["memory_probe"] == got
        and "memory_probe" not in out["layer_bound"]["cases"][1]
    )
    assert out["sources"] == [{"commit": "a"}, {"commit": "b"}]
    lines = layer_bound.memory_probe_lines(out["layer_bound"]["cases"])
    assert (
        lines[-1]
        == "| x/1B | 1000.0 | 1500.0 | 1000.0 | full/none | 1200.0 | 1000.0 | none | 50.0 | 1.500 | 1.200 |"
    )
    with pytest.raises(SystemExit, match="z/1B has no row"):
        ceiling.attach_memory(res, [{"source": {}, "cases": {"z/1B": got}}])
