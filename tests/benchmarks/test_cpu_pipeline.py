"""benchmarks/cpu_pipeline.py decides on paired per-round ratios (not a ratio of medians), reports
their spread and draws the launch order per round from a seed."""

from __future__ import annotations

import importlib
import random

import pytest


@pytest.fixture(scope="module")
def cpu_pipeline(benchmarks_on_path):
    return importlib.import_module("cpu_pipeline")


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
    assert "NOT met" in cpu_pipeline.target_line("Entrain", p)
    good = cpu_pipeline.paired(rounds([80.0, 85.0, 88.0], [100.0, 100.0, 100.0]), "entrain")
    line = cpu_pipeline.target_line("Entrain", good)
    assert line.endswith("-> met.") and "min 0.800, max 0.880" in line


def test_llm_dominant_targets_are_paired_against_each_baseline(cpu_pipeline):
    """The text-heavy case decides Entrain <= 1F1B and <= DistTrain, each on its own paired ratios."""
    launches = [
        {"entrain": {"iter_ms": e}, "1f1b": {"iter_ms": b}, "disttrain": {"iter_ms": d}}
        for e, b, d in ((100.0, 120.0, 98.0), (90.0, 100.0, 95.0), (110.0, 100.0, 100.0))
    ]
    lines = {}
    for t in cpu_pipeline.CASES["text-heavy"].targets:
        p = cpu_pipeline.paired(launches, t.row, t.base, t.ratio)
        lines[t.base] = cpu_pipeline.target_line(t.label, p)
        assert p["target"] == 1.0 and p["base"] == t.base
    # vs 1F1B: 0.833, 0.9, 1.1 -> median 0.9, 2 rounds met; vs DistTrain: 1.020, 0.947, 1.1 -> 1.020
    assert "<= 1.0x 1F1B's" in lines["1f1b"] and "median 0.900" in lines["1f1b"]
    assert "2/3 rounds" in lines["1f1b"] and lines["1f1b"].endswith("-> met.")
    assert "<= 1.0x DistTrain's" in lines["disttrain"] and "median 1.020" in lines["disttrain"]
    assert "1/3 rounds" in lines["disttrain"] and lines["disttrain"].endswith("-> NOT met.")


def test_llm_dominant_launches_pass_the_two_resource_assignment(cpu_pipeline, monkeypatch):
    case = cpu_pipeline.CASES["text-heavy"]
    calls = []
    monkeypatch.setattr(cpu_pipeline.subprocess, "run", lambda cmd, **_: calls.append(cmd))
    order = cpu_pipeline.round_order(random.Random(0), case)
    cpu_pipeline.launch("out", 3, order, case)
    assert len(calls) == 1 + len(case.extension_rows)
    flags = {}
    for cmd in calls:
        systems = cmd[cmd.index("--system") + 1]
        assert cmd[cmd.index("--dataset") + 1] == "text-heavy" and "--encoder-stages" not in cmd
        flags["entrain" if "," in systems else cmd[cmd.index("--out") + 1]] = cmd[
            cmd.index("--assignment") + 1
        ]
    assert flags == {"entrain": "two-resource", "out/entrain-auto": "auto", "out/entrain-paper": "paper"}
    assert sorted(next(i for i in order if "+" in i).split("+")) == sorted(cpu_pipeline.SYSTEMS)


def test_llm_dominant_data_is_llm_bound_and_varies(cpu_pipeline):
    """The text-heavy case's data (as train draws it) puts most work on the LLM, varying per sample."""
    import numpy as np

    from entrain.core.costs.presets import build_cost_model
    from entrain.core.workload.samples import pixel_limits
    from entrain.data.workload_io import load_workload

    cfg = cpu_pipeline.LLM_CONFIG
    cost = build_cost_model(cfg["model"], "cpu-tiny")
    vision = pixel_limits(None, cfg["max_pixels"])
    batches = load_workload(
        cfg["dataset"], cost, global_batch=cfg["global_batch"], iterations=4, seed=0, vision=vision
    )
    works = [w for batch in batches for w in batch]
    llm, enc = np.array([w.llm for w in works]), np.array([w.encoder for w in works])
    assert llm.sum() > 3 * enc.sum() and llm.std() / llm.mean() > 0.5


def test_assignment_counts_come_from_the_plan(cpu_pipeline):
    chosen = {"assignment": "auto", "assignment_chosen": [["two-resource"], ["paper"], ["two-resource"]]}
    assert cpu_pipeline.assignment_counts(chosen) == {"paper": 1, "two-resource": 2}
    assert cpu_pipeline.assignment_counts({"assignment": "paper"}) == {"paper": 1}
    assert cpu_pipeline.assignment_counts({}) == {}


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


def test_skewed_rows_are_three_different_entrain_plans(cpu_pipeline, monkeypatch):
    """train's defaults (auto layout, split gradients on) would run one plan in all three Entrain rows."""
    calls = []
    monkeypatch.setattr(cpu_pipeline.subprocess, "run", lambda cmd, **_: calls.append(cmd))
    cpu_pipeline.launch("out", 3, cpu_pipeline.round_order(random.Random(0)))
    rows = {}
    for cmd in calls:
        row = "entrain" if "," in cmd[cmd.index("--system") + 1] else cmd[cmd.index("--out") + 1]
        rows[row] = (cmd[cmd.index("--entrain-layout") + 1], cmd[cmd.index("--split-weight-grads") + 1])
    assert rows == {"entrain": ("disjoint", "off"), "out/entrain-shared": ("shared", "off"),
                    "out/entrain-split": ("disjoint", "on")}  # fmt: skip


def test_llm_forward_std_sums_the_llm_stages_per_microbatch(cpu_pipeline):
    rec = [
        {"stage": 0, "mb": 0, "fwd_ms": 50.0},  # encoder: left out
        {"stage": 1, "mb": 0, "fwd_ms": 10.0},
        {"stage": 2, "mb": 0, "fwd_ms": 20.0},
        {"stage": 1, "mb": 1, "fwd_ms": 4.0},
        {"stage": 2, "mb": 1, "fwd_ms": 4.0},
        {"stage": 2, "mb": 1, "fwd_ms": 2.0},  # a second sub of microbatch 1
    ]
    assert cpu_pipeline.llm_fwd_std_ms(rec, 1) == pytest.approx(10.0)  # per microbatch 30 and 10
    assert cpu_pipeline.llm_fwd_std_ms(rec, 2) == pytest.approx(7.0)  # 20 and 6


def test_paired_report_flags_a_slower_entrain_and_the_sim_error(benchmarks_on_path):
    """``--paired`` (cpu_paired.py): the real ratio with its per-round range, a case where Entrain is
    slower is marked, the simulator's error is sim / real - 1, the decisions before and after the refit."""
    cpu_paired = importlib.import_module("cpu_paired")
    result = {
        "config": {}, "profile": None, "rounds": 3, "steps": 4, "orders": [],
        "iter_ms": [{"entrain": 110.0, "1f1b": 100.0}, {"entrain": 90.0, "1f1b": 100.0},
                    {"entrain": 105.0, "1f1b": 100.0}],
        "busiest_cpu_over_wall": [{"entrain": 0.9, "1f1b": 0.8}] * 3,
        "ratios": [1.1, 0.9, 1.05], "real_ratio": 1.05, "sim_ratio": 0.945, "refit_sim_ratio": 1.05,
        "sim_rel_error": 0.945 / 1.05 - 1, "refit_sim_rel_error": 0.0,
        "decisions": {"entrain": {"stages": "encoder[0,4)@0 llm[0,6)@1", "split_weight_grads": "True",
                                  "assignment": "paper 2"}},
        "decisions_planned": {"layout": "shared"}, "decisions_refit": {"layout": "disjoint"},
        "refit_action_overhead_ms": 3.0,
    }  # fmt: skip
    joint = {**result, "joint_sim_ratio": 1.029, "joint_sim_rel_error": 1.029 / 1.05 - 1}
    text = cpu_paired.report(
        {"multi-image": result, "multi-image (joint)": joint}, {"multi-image": [False, 0.1]}
    )
    row = next(line for line in text.splitlines() if line.startswith("| multi-image | cpu-tiny"))
    assert "| 1.050 (0.900-1.100) | **no** | 0.945 | -10.0% | 1.050 | +0.0% | - | - | 0.90 / 0.80 |" in row
    row = next(line for line in text.splitlines() if line.startswith("| multi-image (joint) | cpu-tiny"))
    assert "| 1.050 | +0.0% | 1.029 | -2.0% | 0.90 / 0.80 |" in row  # the joint refit's ratio and error
    assert "| multi-image | layout shared | layout disjoint (3.00) |" in text
    assert "multi-image NOT passed (10%)" in text


def test_paired_pass_ratios_entrain_to_each_baseline(benchmarks_on_path):
    """A four-system pass pairs Entrain against each baseline per round (Entrain / baseline, the median
    of the rounds' ratios, not a ratio of medians), the simulated ratio of the same Plans with its error
    sim / real - 1, and marks each target (real <= 1.0, |error| <= 5 %) per baseline."""
    cpu_paired = importlib.import_module("cpu_paired")
    per_round = [
        {"entrain": 90.0, "1f1b": 100.0, "dflop": 100.0},
        {"entrain": 120.0, "1f1b": 100.0, "dflop": 80.0},
        {"entrain": 95.0, "1f1b": 100.0, "dflop": 200.0},
    ]
    sim = {"entrain": 80.0, "1f1b": 100.0, "dflop": 100.0}
    refit = {"entrain": 90.0, "1f1b": 100.0, "dflop": 90.0}
    p = cpu_paired.pair(per_round, sim, refit, "1f1b")
    assert p["ratios"] == pytest.approx([0.9, 1.2, 0.95])
    assert p["real_ratio"] == pytest.approx(0.95)
    assert p["sim_ratio"] == pytest.approx(0.8)
    assert p["sim_rel_error"] == pytest.approx(0.8 / 0.95 - 1)  # -15.8 %: outside 5 %
    assert p["refit_sim_ratio"] == pytest.approx(0.9)
    assert (p["real_met"], p["sim_met"]) == (True, False)
    d = cpu_paired.pair(per_round, sim, refit, "dflop")
    # paired 0.9, 1.5, 0.475 -> median 0.9; the ratio of medians would be 95 / 100
    assert d["ratios"] == pytest.approx([0.9, 1.5, 0.475])
    assert d["real_ratio"] == pytest.approx(0.9)
    assert d["refit_sim_ratio"] == pytest.approx(1.0)
    slower = cpu_paired.pair([{"entrain": 105.0, "dflop": 100.0}], sim, refit, "dflop")
    assert slower["real_ratio"] == pytest.approx(1.05)
    assert (slower["real_met"], slower["sim_met"]) == (False, False)  # 0.8 / 1.05 - 1 = -23.8 %
    near = cpu_paired.pair([{"entrain": 82.0, "dflop": 100.0}], sim, refit, "dflop")
    assert (near["real_met"], near["sim_met"]) == (True, True)  # 0.8 / 0.82 - 1 = -2.4 %


def test_paired_report_has_a_row_per_baseline_and_its_targets(benchmarks_on_path):
    """The second table: one row per (pass, baseline) with the pair's numbers; one target line per
    baseline and target naming the passes that miss it; a pass without ``pairs`` has no row there."""
    cpu_paired = importlib.import_module("cpu_paired")
    per_round = [{"entrain": 90.0, "1f1b": 100.0, "encoder-rebalance": 95.0, "dflop": 85.0}] * 3
    sim = {"entrain": 90.0, "1f1b": 100.0, "encoder-rebalance": 100.0, "dflop": 100.0}
    pairs = {b: cpu_paired.pair(per_round, sim, sim, b) for b in cpu_paired.BASELINES}
    stages = {"stages": "encoder[0,4)@0 llm[0,6)@1", "split_weight_grads": "False", "assignment": "paper 1"}
    result = {
        "config": {}, "profile": None, "rounds": 3, "steps": 8, "orders": [], "iter_ms": per_round,
        "busiest_cpu_over_wall": [dict.fromkeys(per_round[0], 0.5)] * 3,
        **{k: pairs["1f1b"][k] for k in ("ratios", "real_ratio", "sim_ratio", "sim_rel_error",
                                         "refit_sim_ratio", "refit_sim_rel_error")},
        "decisions": dict.fromkeys(cpu_paired.PASS_SYSTEMS, stages), "pairs": pairs,
    }  # fmt: skip
    old = {k: v for k, v in result.items() if k != "pairs"}
    text = cpu_paired.report({"skewed (four systems)": result, "skewed": old}, {})
    labels = ("1F1B", "encoder-rebalance", "DFLOP")
    rows = [
        line for line in text.splitlines() if line.startswith("|") and line.split("|")[2].strip() in labels
    ]
    assert len(rows) == 3  # the pass without pairs has a row in the first table only
    assert rows[0].startswith("| skewed (four systems) | 1F1B |")
    assert "| 90 | 100 | 0.900 (0.900-0.900) | yes | 0.900 | +0.0% | yes |" in rows[0]
    assert rows[1].startswith("| skewed (four systems) | encoder-rebalance |")
    assert "| 90 | 95 | 0.947 (0.947-0.947) | yes | 0.900 | -5.0% | yes |" in rows[1]
    assert rows[2].startswith("| skewed (four systems) | DFLOP |")
    assert "| 90 | 85 | 1.059 (1.059-1.059) | **no** | 0.900 | -15.0% | **no** |" in rows[2]
    assert "| 0.50 / 0.50 | encoder[0,4)@0 llm[0,6)@1 |" in rows[2]
    assert (
        "Target: Entrain / DFLOP real ratio <= 1.0: met on 0 of 1; NOT met on skewed (four systems) 1.059."
        in text
    )
    assert "Target: Entrain / 1F1B real ratio <= 1.0: met on 1 of 1." in text
    assert (
        "Target: Entrain / DFLOP |sim / real - 1| <= 5%: met on 0 of 1; NOT met on skewed (four systems) -15.0%."
        in text
    )


@pytest.mark.parametrize(
    "systems", [("entrain", "1f1b", "encoder-rebalance", "dflop"), ("entrain", "1f1b", "dflop")]
)
def test_paired_launch_orders_put_every_system_first_equally_often(benchmarks_on_path, systems):
    """``cpu_paired.launch_orders``: over a full Williams square (n rounds, 2n for odd n) every system
    runs first and in every place equally often and right after every other equally often; over 6
    rounds of 4 systems, first as often as any other give or take one (the orders drawn per round from
    seed 0 never ran Entrain first)."""
    from collections import Counter

    cpu_paired = importlib.import_module("cpu_paired")
    n = len(systems)
    full = n if n % 2 == 0 else 2 * n
    for seed in (0, 1, 7):
        orders = cpu_paired.launch_orders(systems, full, seed)
        assert all(sorted(o) == sorted(systems) for o in orders)
        for place in range(n):
            assert Counter(o[place] for o in orders) == {s: full // n for s in systems}, (seed, place)
        after = Counter((a, b) for o in orders for a, b in zip(o, o[1:]))
        assert set(after.values()) == {full // n} and len(after) == n * (n - 1), seed
        assert cpu_paired.launch_orders(systems, 2 * full, seed) == orders + orders
    firsts = Counter(o[0] for o in cpu_paired.launch_orders(systems, 6, 0))
    assert set(firsts) == set(systems) and max(firsts.values()) - min(firsts.values()) <= 1
