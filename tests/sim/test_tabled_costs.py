"""Simulator pricing of measured cost tables: a stage with a piecewise-linear ``table`` layer is
priced exactly (``CostModel.stage_ms`` over the samples' units), not by its first segment."""

from __future__ import annotations

from dataclasses import replace

import pytest

from entrain.core.costs.costmodel import Quadratic
from entrain.core.ir.plan import ActionKind
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.workload.samples import SampleMeta
from entrain.core.workload.work import SampleWork
from tests.sim.fixtures import KEY, disjoint_layout, toy_cost

# flat (per-call overhead) up to 64 tokens, then steep: the first segment's slope is 0.001 ms/token
TABLE = ((16.0, 1.0), (64.0, 1.05), (256.0, 9.0), (1024.0, 40.0))


def _tabled_cost():
    cost = toy_cost(enc_layers=2, llm_layers=2, call_ms=0.1)
    layers = list(cost.llm.layers)
    q = Quadratic(0.0, 0.001, 1.0, TABLE)
    layers[1] = replace(layers[1], fwd={KEY: q}, bwd={KEY: q.scaled(2.0)})
    return replace(cost, llm=replace(cost.llm, layers=tuple(layers)))


def _samples(cost) -> dict[str, SampleWork]:
    metas = [SampleMeta(f"s{i}", ((28 * (i + 1), 56),), text_tokens=40 + 150 * i) for i in range(4)]
    return {m.id: cost.sample_work(m) for m in metas}


@pytest.mark.parametrize("kind", [ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W])
@pytest.mark.parametrize("ids", [("s0",), ("s3",), ("s1", "s2"), ("s0", "s1", "s2", "s3")])
def test_tabled_stage_is_priced_exactly(kind, ids):
    cost = _tabled_cost()
    layout = disjoint_layout(1, 2, enc_layers=2, llm_layers=2)
    samples = _samples(cost)
    costs = PlanCosts(layout, cost, samples)
    assert costs.tabled == (False, False, True)
    units = [x for sid in ids for x in cost.units("llm", samples[sid].meta)]
    phase = "fwd" if kind is ActionKind.F else "bwd"
    exact = cost.stage_ms("llm", 1, 2, units, phase, num_calls=1)
    inp = cost.stage_ms("llm", 1, 2, units, "bwd_input", num_calls=1)
    expected = {ActionKind.I: inp, ActionKind.W: exact - inp}.get(kind, exact)
    assert costs.compute_ms(2, kind, ids) == pytest.approx(expected)
    # the 1-and-2-token sampling of the quadratic path would follow the flat first segment
    quad = costs.stage_quads[2]
    sq, lin = costs._sums(2, ids)
    first_segment = (quad.fwd_a * sq + quad.fwd_b * lin + quad.fwd_c) if phase == "fwd" else None
    if phase == "fwd" and max(units) > 64:
        assert first_segment < 0.5 * exact


def test_split_backward_follows_each_layers_input_fraction():
    """``I`` = the input-gradient share of every layer's backward (``bwd_input_fraction`` of a trainable
    layer, all of a frozen one that passes gradients), ``W`` = the rest; the first encoder stage sends
    no gradient, so its ``I`` is free and its ``W`` the whole backward."""
    cost = toy_cost(enc_layers=2, llm_layers=2, call_ms=0.1)
    enc = list(cost.encoder.layers)
    enc[1] = replace(enc[1], bwd_input_fraction=0.3)
    llm = list(cost.llm.layers)
    llm[0] = replace(llm[0], trainable=False)
    cost = replace(
        cost, encoder=replace(cost.encoder, layers=tuple(enc)), llm=replace(cost.llm, layers=tuple(llm))
    )
    layout = disjoint_layout(2, 2, enc_layers=2, llm_layers=2)
    samples = _samples(cost)
    costs = PlanCosts(layout, cost, samples)
    ids = ("s1", "s2")
    for stage in range(4):
        b, i, w = (costs.compute_ms(stage, k, ids) for k in (ActionKind.B, ActionKind.I, ActionKind.W))
        assert i + w == pytest.approx(b)
        units = [x for sid in ids for x in cost.units(layout.stages[stage].component, samples[sid].meta)]
        comp, first = layout.stages[stage].component, layout.stages[stage].first_layer
        layer = cost.component(comp).layers[first]
        full = cost.layer_ms(comp, first, units, "bwd", num_calls=1)
        expected_i = {0: 0.0, 1: 0.3 * full, 2: full, 3: layer.bwd_input_fraction * full}[stage]
        assert i == pytest.approx(expected_i), stage


def test_quadratic_stages_keep_the_closed_form():
    cost = toy_cost(enc_layers=2, llm_layers=2, call_ms=0.1)
    layout = disjoint_layout(1, 2, enc_layers=2, llm_layers=2)
    samples = _samples(cost)
    costs = PlanCosts(layout, cost, samples)
    assert costs.tabled == (False, False, False)
    ids = ("s1", "s3")
    for stage, (comp, first, end) in enumerate([("encoder", 0, 2), ("llm", 0, 1), ("llm", 1, 2)]):
        units = [x for sid in ids for x in cost.units(comp, samples[sid].meta)]
        exact = cost.stage_ms(comp, first, end, units, "bwd", num_calls=1)
        assert costs.compute_ms(stage, ActionKind.B, ids) == pytest.approx(exact)


def _head_cost():
    """The toy model with its last LLM layer run on label tokens only (an ``lm_head``)."""
    cost = toy_cost(enc_layers=2, llm_layers=2, call_ms=0.1)
    layers = list(cost.llm.layers)
    layers[1] = replace(layers[1], per_label=True)
    return replace(cost, llm=replace(cost.llm, layers=tuple(layers)))


@pytest.mark.parametrize("kind", [ActionKind.F, ActionKind.B])
def test_a_label_layer_is_priced_on_each_samples_answer_tokens(kind):
    """Two samples of equal length, one answering in 10 tokens, one in 900: the head stage costs what
    their answers cost; without answer counts, LABEL_FRACTION of the tokens."""
    cost = _head_cost()
    layout = disjoint_layout(1, 2, enc_layers=2, llm_layers=2)
    metas = [
        SampleMeta("short", (), 1000, answer_tokens=10),
        SampleMeta("long", (), 1000, answer_tokens=900),
        SampleMeta("unknown", (), 1000),
    ]
    costs = PlanCosts(layout, cost, {m.id: cost.sample_work(m) for m in metas})
    assert costs.tabled == (False, False, False) and costs.label_stages == (False, False, True)
    phase = "fwd" if kind is ActionKind.F else "bwd"
    head = cost.llm.layers[1].fwd[KEY] if phase == "fwd" else cost.llm.layers[1].bwd[KEY]
    for sid, labels in (("short", 10), ("long", 900), ("unknown", 200)):
        assert costs.compute_ms(2, kind, (sid,)) == pytest.approx(head(labels))
    assert costs.compute_ms(2, kind, ("unknown", "unknown")) == pytest.approx(
        2 * head.variable_ms(200) + head.constant_ms
    )  # the closed form
    assert costs.compute_ms(2, kind, ("short", "long")) == pytest.approx(
        head.variable_ms(10) + head.variable_ms(900) + head.constant_ms
    )
    # the decoder stage in front of it sees tokens only
    assert costs.compute_ms(1, kind, ("short",)) == pytest.approx(costs.compute_ms(1, kind, ("long",)))
