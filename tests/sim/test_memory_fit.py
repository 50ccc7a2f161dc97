"""Memory-aware plans: on heavy vision data every Algorithm 2 system gets a
plan that fits device memory in simulation (recomputation where a rank overflows); when nothing fits
the error names the largest sample and what would make it fit."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from entrain.cli.main import main
from entrain.core.planning.setups import SystemSetup
from entrain.core.workload.work import SampleWork
from entrain.sim.memory_fit import fit_memory, fit_memory_best
from entrain.sim.run import run_system
from tests.sim.fixtures import disjoint_layout, toy_cost


@pytest.fixture(scope="module")
def heavy(tmp_path_factory) -> str:
    """Scanned pages (2000-3500 px, long text) alternating with 4-32-frame clips."""
    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("heavy") / "heavy.jsonl"
    with open(path, "w") as f:
        for i in range(64):
            if i % 2 == 0:
                imgs, text = (
                    [[int(rng.integers(2000, 3500)), int(rng.integers(1500, 2600))]],
                    int(rng.integers(300, 1500)),
                )
            else:
                imgs, text = [[448, 448]] * int(rng.integers(4, 33)), int(rng.integers(30, 200))
            f.write(json.dumps({"id": f"s{i}", "images": imgs, "text_tokens": text}) + "\n")
    return str(path)


ARGS = ["--gpus", "16", "--dp", "2", "--tp", "2", "--global-batch", "32", "--iterations", "1"]


@pytest.mark.parametrize("microbatch", ["2", "4"])
def test_simulate_returns_fitting_plans_on_heavy_vision(heavy, microbatch, capsys):
    """Without the memory check Entrain's plan here needs ~58 GB on a 48 GB device at microbatch 2."""
    systems = "entrain,entrain-1f1b,1f1b,disttrain"
    argv = [
        "simulate",
        "--dataset",
        heavy,
        *ARGS,
        "--microbatch-size",
        microbatch,
        "--systems",
        systems,
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    for name, s in out["systems"].items():
        assert s["fits_memory"] is True, (name, s["peak_memory_bytes"])
        assert max(s["peak_memory_bytes_per_rank"]) <= s["device_memory_bytes"]
        assert len(s["config"]["recompute"]) >= s["config"]["ranks_per_replica"]
    assert any(m != "none" for s in out["systems"].values() for m in s["config"]["recompute"])


def test_plan_hands_train_a_layout_that_fits(heavy, tmp_path, capsys):
    """``plan --out`` runs simulate's memory check: here Algorithm 2's own plan overflows (simulate
    needs eager forwards within the 1F1B peak), and the file's plan fits on simulate's batches."""
    from entrain.core.costs.presets import resolve_cost_model
    from entrain.core.planning.setups import read_plan_file
    from entrain.data.workload_io import load_workload
    from entrain.sim.run import run_system

    argv = ["--dataset", heavy, *ARGS, "--gpus", "8", "--dp", "1", "--microbatch-size", "2"]
    assert main(["plan", *argv, "--out", str(tmp_path / "plan.json"), "--json"]) == 0
    capsys.readouterr()
    system, setup = read_plan_file(str(tmp_path / "plan.json"))
    assert json.loads((tmp_path / "plan.json").read_text())["fits_memory"] is True
    cost = resolve_cost_model("qwen25vl-llama3-1b")
    batches = list(load_workload(heavy, cost, global_batch=32, iterations=1, seed=0, tp=2))
    run = run_system(system, setup.layout, batches, cost, dict(setup.options))
    assert run.metrics.fits_memory is True, max(run.metrics.peak_memory_bytes_per_rank)


@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_no_fit_error_names_the_largest_sample_and_the_remedies(heavy, command, capsys):
    """Eager encoder attention on 3500 px pages: the score matrices alone overflow 48 GB."""
    argv = [command, "--dataset", heavy, *ARGS, "--microbatch-size", "2", "--attention", "encoder=eager"]
    if command == "simulate":
        argv += ["--systems", "entrain"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no configuration fits in device memory" in err[0]
    named = err[0].split("the largest sample is '")[1].split("'")[0]
    assert named.startswith("s") and int(named[1:]) % 2 == 0  # a page, not a clip
    for remedy in ("--gpus", "--max-pixels", "--microbatch-size", "recomputation"):
        assert remedy in err[0]


def test_memory_bounded_dip_greedy_fits_where_dip_greedy_does_not(heavy, capsys):
    """``dip-greedy-mem``'s in-flight window keeps every rank within device memory; the unbounded
    interleaver needs ~84 GB here. Same placement, batching and sub-microbatches: only the window."""
    argv = [
        "simulate",
        "--dataset",
        heavy,
        *ARGS,
        "--microbatch-size",
        "2",
        "--systems",
        "dip-greedy,dip-greedy-mem",
        "--json",
    ]
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)["systems"]
    assert s["dip-greedy"]["fits_memory"] is False and s["dip-greedy-mem"]["fits_memory"] is True
    assert s["dip-greedy-mem"]["iteration_time_ms"] >= s["dip-greedy"]["iteration_time_ms"]
    assert s["dip-greedy-mem"]["config"]["components"] == s["dip-greedy"]["config"]["components"]


def test_entrain_vs_best_baseline_counts_fitting_baselines_only(heavy, capsys):
    """``dip-greedy`` is faster here but needs ~84 GB: the comparison names the fastest *fitting* one."""
    systems = "entrain,dip-greedy,dip-greedy-mem,1f1b"
    argv = ["simulate", "--dataset", heavy, *ARGS, "--microbatch-size", "2", "--systems", systems, "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    s = out["systems"]
    assert s["dip-greedy"]["fits_memory"] is False
    assert s["dip-greedy"]["iteration_time_ms"] < min(
        s[n]["iteration_time_ms"] for n in ("dip-greedy-mem", "1f1b")
    )
    fitting = {n: v["iteration_time_ms"] for n, v in s.items() if n != "entrain" and v["fits_memory"]}
    assert out["best_fitting_baseline"] == min(fitting, key=fitting.get)
    assert out["entrain_vs_best_fitting_baseline"] == pytest.approx(
        min(fitting.values()) / s["entrain"]["iteration_time_ms"]
    )


def test_memory_check_drops_recomputation_the_simulated_peaks_do_not_need():
    """Algorithm 2 picks recomputation on a mean microbatch; the simulated check escalates from none
    as well, rank by rank, so ranks whose real peak has room run without it (the video workload's
    planner put ``full`` on four encoder ranks where two fit at ``selective`` or below)."""
    cost = toy_cost(act_bytes_per_token=10.0, out_bytes_per_token=1.0)
    layout = disjoint_layout(2, 2, k=8)
    batches = [[SampleWork(f"s{i}", 100.0 + 10 * i, 80.0 + 5 * i) for i in range(8)]]
    peaks = run_system("1f1b", layout, batches, cost, {}).metrics.peak_memory_bytes_per_rank
    assert peaks[0] > peaks[1] == max(peaks[1:])  # 1F1B: the first rank holds the most
    cost = replace(cost, hardware=replace(cost.hardware, device_memory_bytes=(peaks[0] + peaks[1]) / 2))
    planned = SystemSetup(
        replace(layout, stages=tuple(replace(s, recompute="full") for s in layout.stages)), {}, ""
    )
    _, as_planned = fit_memory("1f1b", planned, batches, cost)
    got, run = fit_memory_best("1f1b", planned, batches, cost)
    assert [s.recompute for s in got.layout.stages] == ["full", "none", "none", "none"]
    assert run.metrics.fits_memory is True
    assert run.metrics.iteration_time_ms < as_planned.metrics.iteration_time_ms


def test_memory_check_recomputes_per_layer_where_that_suffices():
    """A rank a little over device memory recomputes only the layers that cover the overflow (a stage
    of their own on the same rank), not every layer it holds: on the video workload this took Entrain
    from 107 to 93 s (benchmarks/results/workload_zoo.md)."""
    cost = toy_cost(act_bytes_per_token=10.0, out_bytes_per_token=1.0)
    layout = disjoint_layout(1, 1, k=8)
    batches = [[SampleWork(f"s{i}", 100.0 + 10 * i, 80.0 + 5 * i) for i in range(8)]]
    peak = run_system("entrain-1f1b", layout, batches, cost, {}).metrics.peak_memory_bytes_per_rank[0]
    cost = replace(cost, hardware=replace(cost.hardware, device_memory_bytes=0.95 * peak))
    got, run = fit_memory("entrain-1f1b", SystemSetup(layout, {}, ""), batches, cost)
    # selective saves nothing on the toy layers; full on layer 0 neither (a component's first layer
    # keeps its activations): the fewest layers that cover 5% are layers 0-1
    modes = [(s.pp_rank, s.first_layer, s.end_layer, s.recompute) for s in got.layout.stages]
    assert modes == [(0, 0, 2, "full"), (0, 2, 4, "selective"), (1, 0, 4, "none")]
    assert run.metrics.fits_memory is True
    whole = replace(layout, stages=(replace(layout.stages[0], recompute="full"), layout.stages[1]))
    assert (
        run.metrics.iteration_time_ms
        < run_system("entrain-1f1b", whole, batches, cost, {}).metrics.iteration_time_ms
    )
    _, one_per_rank = fit_memory("disttrain", SystemSetup(layout, {}, ""), batches, cost)
    assert len(one_per_rank.layout.stages) == 2  # a generator without stage chains keeps whole ranks
