"""benchmarks/ceiling.py: the bound is a true lower bound. On two tiny cases every system's simulated
iteration time is at least the case's bound (and the any-degree bound is at most the setup's), and
Entrain's gap splits into parts that add up to its time. The committed report is its JSON rendered, and
docs/design.md quotes that JSON."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest


def _argv(dataset: str, tp: int) -> list[str]:
    return ["simulate", "--dataset", dataset, "--model", "qwen25vl-llama3-1b", "--hardware", "a40-paper",
            "--gpus", "8", "--dp", "2", "--tp", str(tp), "--global-batch", "16", "--microbatch-size", "2",
            "--iterations", "1"]  # fmt: skip


@pytest.mark.parametrize(("dataset", "tp"), [("synthchartnet", 1), ("text-heavy", 2)])
def test_no_system_is_faster_than_the_bound(benchmarks_on_path, dataset, tp):
    ceiling = importlib.import_module("ceiling")
    zoo = importlib.import_module("workload_zoo")
    row = ceiling.run_case(
        "tiny", {"argv": _argv(dataset, tp), "systems": list(zoo.SYSTEMS), "lists": ["zoo"]}
    )
    assert "error" not in row, row.get("error")
    times = {n: v["iteration_time_ms"] for n, v in row["systems"].items()}
    assert set(times) == set(zoo.SYSTEMS)
    assert all(t >= row["bound_ms"] for t in times.values()), (row["bound_ms"], times)
    assert row["below_bound"] == []
    assert row["bound_ms"] > 0.5 * min(times.values())  # a bound, and not a trivial one
    assert row["bound_any_ms"] <= row["bound_ms"]
    assert row["degrees"]["llm"][0] == tp  # the setup's TP
    g = row["entrain_gap"]
    parts = row["compute_ms"] + g["recompute_ms"] + g["overheads_ms"] + g["imbalance_ms"] + g["idle_ms"]
    assert parts == pytest.approx(times["entrain"], rel=1e-9)
    assert min(g["recompute_ms"], g["overheads_ms"], g["imbalance_ms"], g["idle_ms"]) >= -1e-6
    assert g["gpus_used"] == 8


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def test_ceiling_report_is_its_json_rendered(benchmarks_on_path):
    ceiling = importlib.import_module("ceiling")
    provenance = importlib.import_module("provenance")
    res = json.loads((RESULTS / "ceiling.json").read_text(encoding="utf-8"))
    assert res["summary"] == ceiling.summary(res)
    want = provenance.stamped(ceiling.render(res), *res["sources"])
    assert (RESULTS / "ceiling.md").read_text(encoding="utf-8") == want, (
        "re-render: ceiling.py --merge ceiling.json"
    )


def test_design_doc_quotes_the_committed_ceiling():
    """docs/design.md's paragraph on what bounds the targets quotes ceiling.json at its rounding."""
    res = json.loads((RESULTS / "ceiling.json").read_text(encoding="utf-8"))
    s, layers = res["summary"], res["layer_bound"]["summary"]
    h = s["headline"]
    text = " ".join(DESIGN.read_text(encoding="utf-8").split())
    want = [
        f"DistTrain / bound is {h['disttrain_ceiling']:.3f}x",
        f"Entrain is at {h['entrain_over_bound']:.3f}x",
        f"geometric mean of best fitting baseline / bound is {s['zoo_geomean_ceiling']:.3f}x",
        f"achieved {s['zoo_geomean_achieved']:.3f}x",
        f"the zoo's {s['zoo_cases']} cases the geometric mean",
        f"contiguous runs is {layers['headline']['disttrain_contiguous_ceiling']:.3f}x DistTrain",
        f"any placement of whole layers {layers['headline']['disttrain_layer_ceiling']:.3f}x",
        f"for looped placements {layers['headline']['disttrain_looped_ceiling']:.3f}x",
        f"{layers['zoo_geomean_looped_ceiling']:.3f}x for looped placements",
        f"{layers['zoo_geomean_contiguous_ceiling']:.3f}x for contiguous runs",
        f"{layers['zoo_geomean_layer_ceiling']:.3f}x for any placement",
    ]
    head = next(c for c in res["layer_bound"]["cases"] if c["case"] == h["case"])["looped_probe"]
    ms = {n: v["iteration_time_ms"] for n, v in head["schedules"].items()}
    want += [
        f"busiest rank is busy {head['schedules']['greedy']['busiest_rank_ms']:.0f} ms",
        f"{ms['phase']:.0f} ms under DIP's phase order, {ms['greedy']:.0f} ms under DIP's greedy interleaver and "
        f"{ms['greedy-mem']:.0f} ms under the interleaver within memory's window, against Entrain's "
        f"{head['entrain_ms']:.0f} ms",
    ]
    quoted = []
    for c in res["layer_bound"]["cases"]:
        short = c["case"].split("/a40")[0]
        if c.get("memory_probe") and f"On {short} Entrain takes" in text:  # the probed cases the doc names
            p, fig = c["memory_probe"], c["memory_probe"]["contiguous_ms"]
            a, b = p["preset"]["iteration_time_ms"], p["unlimited"]["iteration_time_ms"]
            quoted.append(short)
            want += [
                f"{short} Entrain takes {a:.0f} ms",
                f"({a / fig:.3f}x)",
                f"takes {b:.0f} ms ({b / fig:.3f}x)",
            ]
    assert len(quoted) >= 6, quoted
    lv = s["levers"]
    want += [
        f"{lv['memory_probed']} of the zoo's {lv['zoo_cases']} cases",
        f"memory unlimited on the probed cases {lv['memory']:.3f}x",
        f"no idle {lv['idle']:.3f}x",
        f"no recompute {lv['recompute']:.3f}x",
        f"no imbalance beyond the best contiguous split {lv['imbalance beyond the best contiguous split']:.3f}x",
        f"both {lv['idle and imbalance beyond the best contiguous split']:.3f}x",
    ]
    missing = [w for w in want if w not in text]
    assert not missing, f"docs/design.md does not quote ceiling.json: {missing}"
