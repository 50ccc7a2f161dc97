"""``entrain profile``: measured per-layer costs in the analytic presets' schema."""

from __future__ import annotations

import json

import pytest

from entrain.cli.main import main
from entrain.core.costmodel import CostModel
from entrain.core.presets import build_cost_model
from entrain.runtime.profiler import fit_quadratic, image_grid


def test_fit_recovers_a_quadratic_and_stays_non_negative():
    xs = [16, 64, 256, 1024]
    q = fit_quadratic(xs, [2e-5 * x * x + 0.1 * x + 3.0 for x in xs])
    assert q.a == pytest.approx(2e-5, rel=1e-6) and q.b == pytest.approx(0.1, rel=1e-6)
    assert q.c == pytest.approx(3.0, rel=1e-6)
    q = fit_quadratic(xs, [5.0 - 0.001 * x for x in xs])  # decreasing data: no negative coefficients
    assert min(q.a, q.b, q.c) >= 0


def test_image_grid_has_mergeable_sides():
    for n in (16, 64, 100, 256, 1000, 4096):
        t, h, w = image_grid(n)
        assert t == 1 and h % 2 == 0 and w % 2 == 0 and abs(h * w - n) <= max(8, 0.25 * n)


def test_profile_tiny_writes_a_loadable_cost_model(tmp_path, capsys):
    out = tmp_path / "tiny.json"
    assert (
        main(
            [
                "profile",
                "--model",
                "tiny",
                "--device",
                "cpu",
                "--tokens",
                "8,16,32",
                "--repeats",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    cost = CostModel.load(str(out))
    analytic = build_cost_model("tiny", "cpu-tiny")
    assert json.loads(out.read_text()).keys() == analytic.to_json().keys()
    for comp in ("encoder", "llm"):
        assert cost.component(comp).layer_names == analytic.component(comp).layer_names
        for layer in cost.component(comp).layers:
            assert set(layer.fwd) == set(layer.bwd) == {"tp1cp1"}
            q = layer.fwd["tp1cp1"]
            assert min(q.a, q.b, q.c) >= 0 and q(32) > 0
    assert cost.notes["source"] == "entrain profile"


def test_profile_rejects_too_few_sizes(capsys):
    assert main(["profile", "--tokens", "64,256", "--out", "x.json"]) == 2
    assert "at least 3" in capsys.readouterr().err
