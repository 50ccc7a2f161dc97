"""``entrain profile --from-trace`` on a real traced run of the tiny Qwen3-VL-MoE checkpoint (two forked
ranks, encoder | LLM) refits each sparse layer's routing skew from the run's ``expert_tokens``: the
written profile's sparse layers carry ``experts.skew`` = the JSON's ``from_trace.expert_imbalance``
``skew`` (the measured imbalance over a uniform router's on the same tokens), the dense layer none,
and the refitted cost model prices the busiest expert with it."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.layer_costs import uniform_router_imbalance

from .test_moe_routing_metrics import SPARSE, _rows, folder, run  # noqa: F401 (fixtures)


def test_the_refitted_profile_prices_each_sparse_layers_measured_skew(run, tmp_path):  # noqa: F811
    from entrain.cli.main import main

    out = tmp_path / "refit.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["profile", "--from-trace", str(run), "--out", str(out), "--json"]) == 0
    rows = json.loads(buf.getvalue())["from_trace"]["expert_imbalance"]
    cost = CostModel.load(str(out))
    by_name = {x.name: x for x in cost.llm.layers}
    assert by_name["layers.0"].experts is None  # the dense layer (mlp_only_layers)
    want: dict[int, list[float]] = {}
    for row in _rows(run):
        for e in row["expert_tokens"]:
            c = e["tokens_per_expert"]
            uniform = uniform_router_imbalance(e["tokens"], len(c), e["top_k"])
            want.setdefault(e["layer"], []).append(max(c) * len(c) / sum(c) / uniform)
    assert [r["layer"] for r in rows] == SPARSE
    for r in rows:
        skew = max(1.0, sum(want[r["layer"]]) / len(want[r["layer"]]))
        assert r["skew"] == pytest.approx(skew)
        assert by_name[f"layers.{r['layer']}"].experts.skew == pytest.approx(skew)
