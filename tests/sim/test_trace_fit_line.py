"""The per-stage line of ``entrain profile --from-trace`` (``entrain.sim.trace_fit._line``): actions of
nearly one size (chartqa's images capped at 224 x 224 px: predicted sizes 4 % apart) cannot tell the
slope from the per-call constant; the fit then scales the base's line instead of writing a slope of 0
(which priced a 1-image sub-microbatch like a 2-image microbatch, and a one-layer stage like a
quarter of the whole encoder)."""

from __future__ import annotations

import pytest

from entrain.sim.trace_fit import _after_warmup, _line

CONSTANT_MS = 7.0


def _points(sizes, scale):
    """(measured, predicted variable, tokens): measured = scale * (variable + constant), +-2 % noise."""
    noise = [1.02, 0.98, 1.01, 0.99]
    return [(scale * (x + CONSTANT_MS) * noise[i % 4], x, x) for i, x in enumerate(sizes)]


def test_sizes_alike_scale_the_base_line():
    alpha, beta, _, worst = _line(_points([20.0, 20.5, 21.0, 19.5, 20.2, 20.8], 0.6), CONSTANT_MS)
    assert alpha == pytest.approx(0.6, rel=0.03)
    assert beta == pytest.approx(0.6 * CONSTANT_MS, rel=0.03)
    assert worst < 0.05


@pytest.mark.parametrize("scale", [0.5, 1.5])
def test_spread_sizes_fit_slope_and_constant(scale):
    alpha, beta, r2, _ = _line(_points([5.0, 40.0, 12.0, 80.0, 25.0, 60.0], scale), CONSTANT_MS)
    assert alpha == pytest.approx(scale, rel=0.05)
    assert beta == pytest.approx(scale * CONSTANT_MS, abs=1.0)
    assert r2 > 0.99


def test_a_falling_line_scales_the_base_line():
    """Larger actions measured faster (noise): no negative slope, no slope of 0."""
    points = [(30.0, 10.0, 10.0), (28.0, 20.0, 20.0), (26.0, 30.0, 30.0)]
    alpha, beta, _, _ = _line(points, CONSTANT_MS)
    assert alpha > 0 and beta == pytest.approx(alpha * CONSTANT_MS)


def _event(step: int, dur_ms: float) -> dict:
    return {"ph": "X", "pid": 0, "ts": 0.0, "dur": dur_ms * 1e3, "args": {"step": step, "kind": "F"}}


def test_the_warmup_step_is_not_fitted():
    """The run's first step (first calls, the allocator's heap growing: a 66 ms first forward against
    5-11 ms later on chartqa) is left out when later steps exist, as the benchmarks drop it."""
    events = [_event(0, 66.0), _event(0, 7.0), _event(1, 7.0), _event(2, 6.0)]
    assert [e["args"]["step"] for e in _after_warmup(events)] == [1, 2]
    assert _after_warmup(events[:2]) == events[:2]  # a one-step run keeps its only step
