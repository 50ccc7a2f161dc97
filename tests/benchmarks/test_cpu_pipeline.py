"""benchmarks/cpu_pipeline.py decides on paired per-round ratios (not a ratio of medians), reports
their spread and draws the launch order per round from a seed."""

from __future__ import annotations

import importlib
import random
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def cpu_pipeline():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("cpu_pipeline")
    finally:
        sys.path.remove(str(BENCHMARKS))


def rounds(entrain_ms, base_ms):
    return [{"entrain": {"iter_ms": e}, "1f1b": {"iter_ms": b}} for e, b in zip(entrain_ms, base_ms)]


def test_target_is_decided_on_paired_ratios(cpu_pipeline):
    # medians 90 / 100 = 0.90 would pass; the paired ratios 1.25, 0.90, 0.905 have median 0.905
    launches = rounds([50.0, 90.0, 95.0], [40.0, 100.0, 105.0])
    p = cpu_pipeline.paired(launches, "entrain")
    assert p["median"] == pytest.approx(95 / 105) and p["min"] == pytest.approx(0.9) and p["max"] == 1.25
    q1, q3 = (0.9 + 95 / 105) / 2, (95 / 105 + 1.25) / 2  # inclusive quartiles of three values
    assert p["iqr"] == pytest.approx(q3 - q1)
    assert p["rounds_met"] == 1
    assert "NOT met" in cpu_pipeline.target_line("entrain", "Entrain", p)
    good = cpu_pipeline.paired(rounds([80.0, 85.0, 88.0], [100.0, 100.0, 100.0]), "entrain")
    line = cpu_pipeline.target_line("entrain", "Entrain", good)
    assert line.endswith("-> met.") and "min 0.800, max 0.880" in line


def test_launch_order_is_drawn_per_round_from_the_seed(cpu_pipeline):
    orders = [cpu_pipeline.round_order(random.Random(7)) for _ in range(2)]
    assert orders[0] == orders[1]  # seeded
    rng = random.Random(0)
    many = [cpu_pipeline.round_order(rng) for _ in range(30)]
    for order in many:
        shared = next(item for item in order if "+" in item)
        assert sorted(shared.split("+")) == sorted(cpu_pipeline.SYSTEMS)
        assert sorted(i for i in order if "+" not in i) == sorted(cpu_pipeline.EXTENSION_ROWS)
    firsts = {next(i for i in o if "+" in i).split("+")[0] for o in many}
    assert firsts == set(cpu_pipeline.SYSTEMS)  # no system always runs first
