"""The 2026 baselines on the simulator: ``encoder-rebalance`` (DistTrain's split with the encoder
rebalanced across DP replicas by all-to-all) and ``dflop`` (DFLOP's ILP microbatches), planned by
their own batchers and 1F1B, and ``entrain simulate --systems encoder-rebalance,dflop`` end to end."""

from __future__ import annotations

import contextlib
import io
import json
from importlib import resources

import jsonschema

from entrain.cli.main import main
from entrain.core.ir.graph import ReplicaGraph
from entrain.core.ir.validate import validate_plan
from entrain.core.schedules.action_costs import PlanCosts
from entrain.core.systems import DFLOP, DISTTRAIN, ENCODER_REBALANCE, plan_system
from entrain.core.workload.work import SampleWork
from entrain.sim.executor import simulate_plan
from tests.sim.fixtures import disjoint_layout, toy_cost

SMALL = ["--dataset", "chartqa", "--model", "qwen25vl-llama3-1b", "--gpus", "16", "--dp", "2", "--tp", "2",
         "--global-batch", "32", "--microbatch-size", "4", "--seed", "0", "--iterations", "1"]  # fmt: skip


def _batch() -> list[SampleWork]:
    """Per global microbatch of 4 (encoder, LLM work): (6, 6), (6, 1), (1, 6), (1, 1). DistTrain's
    encoder LPT gives one replica 12 LLM units and the other 2; owners by LLM LPT and the encoder
    rebalanced give both 7 of each."""
    out = []
    for m in range(4):
        out += [SampleWork(f"m{m}a", 6.0, 6.0), SampleWork(f"m{m}b", 6.0, 1.0)]
        out += [SampleWork(f"m{m}c", 1.0, 6.0), SampleWork(f"m{m}d", 1.0, 1.0)]
    return out


def _ms(system: str, cost, out_bytes: float = 0.0) -> float:
    layout = disjoint_layout(2, 2, dp=2, k=4, microbatch_size=2)
    plan = plan_system(system, layout, [_batch()], cost)
    validate_plan(plan)
    return simulate_plan(plan, cost)[0].iteration_time_ms


def test_rebalanced_encoder_beats_disttrain_where_its_llm_is_unbalanced():
    cost = toy_cost()
    assert _ms(ENCODER_REBALANCE, cost) < _ms(DISTTRAIN, cost)
    assert _ms(DFLOP, cost) < _ms(DISTTRAIN, cost)


def test_the_all_to_all_is_priced_in_the_boundary_message():
    """Every sample a replica's encoder computes, its own or another replica's, leaves in a boundary
    message of that replica (the all-to-all's send volume), priced by bytes: none travels free."""
    cost = toy_cost(out_bytes_per_token=2e5)
    layout = disjoint_layout(2, 2, dp=2, k=4, microbatch_size=2)
    plan = plan_system(ENCODER_REBALANCE, layout, [_batch()], cost)
    it, last = plan.iterations[0], layout.num_encoder_stages - 1
    costs = PlanCosts(layout, cost, plan.samples)
    crossing = 0
    for r, mbs in enumerate(it.microbatches):
        graph = ReplicaGraph(layout, mbs)
        owned = {s for spec in mbs for s in spec.llm_ids}
        for _, m, u in graph.tasks(last):
            ids = graph.ids(last, m, u)
            assert graph.fwd_outputs(last, m, u), (r, m, u)
            assert costs.message_bytes(last, ids) > costs.message_bytes(last, [s for s in ids if s in owned])
            crossing += any(s not in owned for s in ids)
    assert crossing
    assert _ms(ENCODER_REBALANCE, cost) > _ms(ENCODER_REBALANCE, toy_cost())


def test_simulate_runs_both_new_systems_with_their_schema():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert (
            main(["simulate", *SMALL, "--systems", f"{ENCODER_REBALANCE},{DFLOP},{DISTTRAIN}", "--json"]) == 0
        )
    got = json.loads(out.getvalue())
    schema = json.loads(resources.files("entrain").joinpath("schemas/simulate.json").read_text())
    jsonschema.validate(got, schema)
    assert set(got["systems"]) == {ENCODER_REBALANCE, DFLOP, DISTTRAIN}
    assert all(s["iteration_time_ms"] > 0 for s in got["systems"].values())
