"""Every automatic choice of Entrain is decided by simulating its candidates on the planner's draws and
departs from the paper's default only past the decision margin
(``entrain.core.planning.setups.DECISIONS``); ``plan --json`` / ``--out`` and ``simulate --json`` list them."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache

import pytest

from entrain.cli.main import main
from entrain.core.costs.presets import resolve_cost_model
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.planning import extensions, setups
from entrain.core.planning.setups import (
    DECISION_MARGIN,
    ConfigRequest,
    SystemSetup,
    entrain_variant,
    pick,
    system_setups,
)
from entrain.core.workload.work import SampleWork
from entrain.data.sampling import dataset_sampler
from entrain.sim.memory_fit import fit_memory_best
from entrain.sim.run import run_system
from tests.sim.fixtures import disjoint_layout, toy_cost

REQ = ConfigRequest("synthchartnet", "qwen25vl-llama3-1b", 64, 4, 2, 512, 4, seed=3)
"""The headline command, Entrain's defaults (every choice ``auto``)."""

DEFAULTS = {"config": None, "layout": "disjoint", "microbatch count": "paper", "assignment": "paper", "dp_split": "paper", "ramp": "0",
            "split": "off", "backward_order": "slot", "pair_order": "paper", "sub_microbatches": "off",
            "encoder_rebalance": "off"}  # fmt: skip
"""Each planning decision's paper default (``config``: Algorithm 2's own choice)."""


@cache
def _base():
    """The headline's cost model and Entrain's setup before the extensions (the paper's)."""
    cost = resolve_cost_model(REQ.model, hardware="a40-paper")
    paper = replace(
        REQ, entrain_layout="disjoint", entrain_ramp=0, entrain_split=False, entrain_assignment="paper"
    )
    return cost, system_setups(["entrain"], paper, cost, dataset_sampler(REQ.dataset, REQ.seed))["entrain"]


def features(setup: SystemSetup) -> dict[str, str]:
    """The candidate value each decision sees in ``setup``."""
    o = setup.options
    assignment = o.get("assignment", "paper")
    resplit = assignment != "paper" and o.get("dp_resplit", True)
    return {
        "config": f"pp{len(setup.layout.stages) - setup.layout.num_encoder_stages}",
        "layout": "shared" if len(setup.layout.stages) > setup.layout.ranks_per_replica else "disjoint",
        "microbatch count": o.get("microbatch_count", "paper"),
        "assignment": assignment,
        "dp_split": "two-resource" if resplit else "paper",
        "ramp": str(o.get("ramp_microbatches", 0)),
        "split": "on" if o.get("split_weight_grads") else "off",
        "backward_order": o.get("backward_order", "slot"),
        "pair_order": o.get("pair_order", "paper"),
        "sub_microbatches": "on" if o.get("memory_split", True) else "off",
        "encoder_rebalance": "on" if o.get("encoder_rebalance") else "off",
    }


def fake_judge(faster: dict[tuple[str, str], float]):
    """A judge whose simulated ms is 1000 times the factor of each (decision, value) in ``faster``."""
    seen: list[tuple[str, ...]] = []

    def judge(candidates: dict[str, SystemSetup]) -> dict[str, float]:
        seen.append(tuple(candidates))
        out = {}
        for name, s in candidates.items():
            ms = 1000.0
            for key, value in features(s).items():
                ms *= faster.get((key, value), 1.0)
            out[name] = ms
        return out

    return judge, seen


def _decisions(setup: SystemSetup) -> dict:
    return {d.name: d for d in setup.decisions}


def test_every_decision_is_listed_with_its_candidates_and_defaults_without_a_win():
    cost, base = _base()
    judge, seen = fake_judge({})
    got = entrain_variant(base, REQ, cost, judge)
    d = _decisions(got)
    assert list(d) == ["config", "layout", "microbatch count", "assignment", "dp_split", "ramp", "split", "backward_order",
                       "pair_order", "sub_microbatches", "encoder_rebalance"]  # fmt: skip
    assert list(d) == [n for n in setups.DECISIONS if n != "recompute"]
    assert set(d["layout"].candidates) == {
        "disjoint",
        "shared",
        "shared-batch",
    }  # b_min 8: the 512 draw differs
    assert set(d["microbatch count"].candidates) == {"paper", "requested", "double"}
    assert set(d["assignment"].candidates) == {"paper", "two-resource", "auto"}
    assert set(d["dp_split"].candidates) == {"paper"}  # the paper's assignment: nothing to re-split
    assert set(d["ramp"].candidates) == {"0", "auto"}
    assert set(d["split"].candidates) == {"off", "on"}
    assert set(d["backward_order"].candidates) == {"slot"}  # the disjoint layout: no rank holds two stages
    assert set(d["pair_order"].candidates) == {"paper", "auto"}
    assert set(d["sub_microbatches"].candidates) == {"off", "on"}
    assert set(d["encoder_rebalance"].candidates) == {"off", "on"}
    for name, default in DEFAULTS.items():
        assert d[name].default == (default or d[name].default), name
        assert d[name].chosen == (d[name].default if name != "sub_microbatches" else "on"), name
        assert d[name].margin == DECISION_MARGIN
    # a memory split the draws cannot tell from none (equal times: it cut nothing) stays on
    assert features(got) == {**features(base), "sub_microbatches": "on", "config": features(base)["config"]}
    assert "split_weight_grads" not in got.options  # no win: the paper's whole backwards
    assert len(seen) == 11


@pytest.mark.parametrize(
    "decision, value",
    [("layout", "shared"), ("microbatch count", "requested"), ("microbatch count", "double"), ("assignment", "two-resource"), ("assignment", "auto"), ("ramp", "auto"),
     ("split", "on"), ("pair_order", "auto"), ("sub_microbatches", "on"), ("encoder_rebalance", "on")],
)  # fmt: skip
@pytest.mark.parametrize("factor, flips", [(0.98, True), (0.998, False), (1.02, False)])
def test_a_decision_departs_only_when_the_simulated_win_exceeds_the_margin(decision, value, factor, flips):
    cost, base = _base()
    judge, _ = fake_judge({(decision, value): factor})
    got = entrain_variant(base, REQ, cost, judge)
    d = _decisions(got)[decision]
    assert d.candidates[value] == pytest.approx(1000.0 * factor)
    assert d.chosen == (value if flips else d.default)
    assert features(got)[decision] == d.chosen
    wide = entrain_variant(base, replace(REQ, decision_margin=0.03), cost, judge)  # --decision-margin 3
    assert _decisions(wide)[decision].chosen == d.default and _decisions(wide)[decision].margin == 0.03


def test_dp_resplit_is_decided_under_a_non_paper_assignment():
    cost, base = _base()
    for factor, chosen in ((0.97, "two-resource"), (0.999, "paper")):
        judge, _ = fake_judge({("assignment", "two-resource"): 0.9, ("dp_split", "two-resource"): factor})
        got = entrain_variant(base, REQ, cost, judge)
        d = _decisions(got)
        assert d["assignment"].chosen == "two-resource"
        assert set(d["dp_split"].candidates) == {"paper", "two-resource"}
        assert d["dp_split"].chosen == chosen and features(got)["dp_split"] == chosen
        assert got.options.get("dp_resplit", True) is (chosen == "two-resource")


@pytest.mark.parametrize("factor, chosen", [(0.98, "per-b"), (0.998, "slot"), (1.02, "slot")])
def test_the_backward_order_is_simulated_where_a_rank_holds_two_stages(factor, chosen):
    """The shared layout's fused rank: per-b is taken where it simulates faster past the margin (the
    plan's options say so), slot kept otherwise; on the disjoint layout both are one plan (only slot)."""
    cost, base = _base()
    judge, _ = fake_judge(
        {("layout", "shared"): 0.9, ("split", "on"): 0.9, ("backward_order", "per-b"): factor}
    )
    got = entrain_variant(base, REQ, cost, judge)
    d = _decisions(got)["backward_order"]
    assert features(got)["layout"] == "shared" and set(d.candidates) == {"slot", "per-b"}
    assert d.chosen == chosen and got.options.get("backward_order", "slot") == chosen
    assert d.candidates["per-b"] == pytest.approx(1000.0 * 0.9 * 0.9 * factor)
    # the fused rank takes its replica's features locally: no encoder work to move, only off listed
    assert (
        set(_decisions(got)["encoder_rebalance"].candidates) == {"off"}
        and not got.layout.can_move_encoder_work
    )
    judge, _ = fake_judge({("split", "on"): 0.9, ("backward_order", "per-b"): 0.5})  # disjoint: one plan
    kept = _decisions(entrain_variant(base, REQ, cost, judge))["backward_order"]
    assert set(kept.candidates) == {"slot"} and kept.chosen == "slot"


def test_the_fastest_departure_wins_among_several():
    cost, base = _base()
    judge, _ = fake_judge({("assignment", "two-resource"): 0.95, ("assignment", "auto"): 0.9})
    assert _decisions(entrain_variant(base, REQ, cost, judge))["assignment"].chosen == "auto"
    judge, _ = fake_judge({("assignment", "two-resource"): 0.9, ("assignment", "auto"): 0.95})
    assert _decisions(entrain_variant(base, REQ, cost, judge))["assignment"].chosen == "two-resource"


def test_explicit_flags_are_not_decided():
    cost, base = _base()
    judge, _ = fake_judge({})
    fixed = replace(REQ, entrain_ramp=2, entrain_assignment="two-resource", entrain_layout="disjoint")
    got = entrain_variant(base, fixed, cost, judge)
    assert [d.name for d in got.decisions] == [
        "config",
        "microbatch count",
        "dp_split",
        "split",
        "backward_order",
        "pair_order",
        "sub_microbatches",
        "encoder_rebalance",
    ]
    fixed = replace(fixed, entrain_split=True)
    got = entrain_variant(base, fixed, cost, judge)
    assert [d.name for d in got.decisions] == [
        "config", "microbatch count", "dp_split", "backward_order", "pair_order", "sub_microbatches", "encoder_rebalance"
    ]  # fmt: skip
    assert got.options["split_weight_grads"] is True
    assert got.options["ramp_microbatches"] == 2 and got.options["assignment"] == "two-resource"


def test_a_tied_configuration_is_taken_only_past_the_margin(monkeypatch):
    """Ties among Algorithm 2's configurations: another one within the Eq. 2 tolerance is simulated and
    replaces Algorithm 2's choice only when it wins by more than the margin."""
    cost, base = _base()
    searched = ParallelConfig(gpus=64, dp=4, tp=None, global_batch=512, microbatch_size=4)
    other = extensions.search_candidates(base.profile, cost, searched)
    other = next(c for c in other if c.memory_ok and c.llm.pp != base.config.llm.pp)
    monkeypatch.setattr(extensions, "tied_configs", lambda s, r, c: [s.config, other])
    tag = f"pp{other.llm.pp}"
    for factor, takes in ((0.98, True), (0.998, False)):
        judge, _ = fake_judge({("config", tag): factor})
        got = entrain_variant(base, REQ, cost, judge)
        d = _decisions(got)["config"]
        assert len(d.candidates) == 2 and d.default == next(iter(d.candidates))
        assert (d.chosen != d.default) is takes
        assert (got.config is other) is takes and (features(got)["config"] == tag) is takes


def test_pick_keeps_the_default_within_the_margin_and_on_ties():
    assert pick("x", "a", {"a": 100.0, "b": 99.6}, 0.005).chosen == "a"
    assert pick("x", "a", {"a": 100.0, "b": 99.4}, 0.005).chosen == "b"
    assert pick("x", "a", {"a": 100.0, "b": 99.0, "c": 99.0}, 0.005).chosen == "b"
    assert pick("x", "a", {"a": float("inf"), "b": 1e9}, 0.5).chosen == "b"  # the default does not fit
    assert pick("x", "a", {"a": 100.0}, 0.0).chosen == "a"


def test_recompute_departs_from_the_planners_only_past_the_margin():
    """The memory check's candidates (the planner's recomputation per rank first, the default; per
    layer; from the simulated peaks): per layer is faster here, taken at margin 0 and not past it.
    ``k`` 6 is these samples' ``K_eff``, so the requested-microbatch start does not apply
    (``tests/sim/test_requested_microbatches.py``)."""
    cost = toy_cost(act_bytes_per_token=10.0, out_bytes_per_token=1.0)
    layout = disjoint_layout(1, 1, k=6)
    batches = [[SampleWork(f"s{i}", 100.0 + 10 * i, 80.0 + 5 * i) for i in range(8)]]
    peak = run_system("entrain-1f1b", layout, batches, cost, {}).metrics.peak_memory_bytes_per_rank[0]
    cost = replace(cost, hardware=replace(cost.hardware, device_memory_bytes=0.95 * peak))
    got, _ = fit_memory_best("entrain-1f1b", SystemSetup(layout, {}, ""), batches, cost, margin=0.0)
    d = got.decisions[-1]
    assert (
        d.name == "recompute"
        and d.default == "planner"
        and set(d.candidates) == {"planner", "planner per layer"}
    )
    gain = 1.0 - d.candidates["planner per layer"] / d.candidates["planner"]
    assert gain > 0.0 and d.chosen == "planner per layer"
    kept, _ = fit_memory_best("entrain-1f1b", SystemSetup(layout, {}, ""), batches, cost, margin=gain + 1e-6)
    assert kept.decisions[-1].chosen == "planner" and len(kept.layout.stages) == 2


SMALL = ["--dataset", "text-heavy", "--model", "qwen25vl-llama3-1b", "--gpus", "16", "--dp", "2", "--tp", "2",
         "--global-batch", "64", "--microbatch-size", "4", "--seed", "0"]  # fmt: skip
"""A workload where the assignment matters: text-heavy (the paper's assignment balances encoder work
only; the two-resource one balances both)."""


@cache
def _simulated(margin_pct: str) -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["simulate", *SMALL, "--iterations", "1", "--systems", "entrain,1f1b", "--json",
                     "--decision-margin", margin_pct]) == 0  # fmt: skip
    return json.loads(out.getvalue())


def test_simulate_lists_each_systems_decisions_and_the_flag_sets_the_margin():
    got = _simulated("0.5")
    d = {x["name"]: x for x in got["systems"]["entrain"]["decisions"]}
    assert list(d) == list(setups.DECISIONS)
    assert all(x["margin"] == pytest.approx(0.005) for x in d.values())
    a = d["assignment"]["candidates"]
    assert a["two-resource"] < 0.995 * a["paper"] and d["assignment"]["chosen"] != "paper"
    assert [x["name"] for x in got["systems"]["1f1b"]["decisions"]] == ["recompute"]
    wide = {x["name"]: x for x in _simulated("99")["systems"]["entrain"]["decisions"]}
    # nothing wins by 99 %; a memory split that cut nothing (equal times) stays on
    inert = wide["sub_microbatches"]["candidates"]
    assert all(x["chosen"] == x["default"] for n, x in wide.items() if n != "sub_microbatches")
    assert wide["sub_microbatches"]["chosen"] == ("on" if inert["on"] == inert["off"] else "off")
    assert wide["assignment"]["candidates"] == pytest.approx(a)


def test_plan_json_and_out_carry_the_decisions_and_train_reads_such_a_file(tmp_path, capsys):
    from entrain.core.planning.setups import read_plan_file

    out = tmp_path / "plan.json"
    assert main(["plan", *SMALL, "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads(out.read_text())
    assert printed["decisions"] == written["decisions"]
    assert [x["name"] for x in written["decisions"]] == list(setups.DECISIONS)
    system, setup = read_plan_file(str(out), expect_model=written["model"])
    assert system == "entrain" and setup.options == written["schedule_options"]
    del written["decisions"]  # a plan file from before the decisions
    out.write_text(json.dumps(written))
    assert read_plan_file(str(out), expect_model=written["model"])[1].options == setup.options


def test_the_judge_reuses_a_twins_time_only_where_the_twin_ran_the_same_plan(monkeypatch):
    """``choose.TWINS``: ``memory_split`` off reuses the time of the run with it on where that made no
    cut, ``ramp 0`` the time of ``auto`` where that ramped nowhere; a twin that did ramp is not reused
    (each equals a fresh judge's simulation of the candidate itself)."""
    from entrain.sim import choose

    req = ConfigRequest("text-heavy", "qwen25vl-llama3-1b", 16, 2, 2, 64, 4, seed=0)
    cost = resolve_cost_model(req.model, hardware="a40-paper")
    sampler = dataset_sampler(req.dataset, req.seed)
    paper = replace(
        req, entrain_layout="disjoint", entrain_ramp=0, entrain_split=False, entrain_assignment="paper"
    )
    base = system_setups(["entrain"], paper, cost, sampler)["entrain"]
    auto = replace(base, options={"ramp_microbatches": "auto", "split_weight_grads": True})
    cands = {"auto": auto, "0": replace(auto, options={"split_weight_grads": True}),
             "off": replace(auto, options={**auto.options, "memory_split": False})}  # fmt: skip
    calls = []
    real = choose.fit_memory
    monkeypatch.setattr(choose, "fit_memory", lambda *a, **k: calls.append(1) or real(*a, **k))
    shared = choose.candidate_judge(sampler, cost, req)
    got = {n: shared({n: s})[n] for n, s in cands.items()}
    assert len(calls) == 2  # "auto" ramped somewhere (so "0" is simulated); "off": no cut, reused
    fresh = {n: choose.candidate_judge(sampler, cost, req)({n: s})[n] for n, s in cands.items()}
    assert got == fresh and got["0"] != got["auto"]


@pytest.mark.parametrize("dataset, simulated", [("mixture", 2), ("text-heavy", 1)])
def test_the_judge_simulates_the_requested_count_only_where_k_eff_fell_below_it(
    monkeypatch, dataset, simulated
):
    """The ``microbatch count`` decision's ``requested`` candidate is simulated only where ``K_eff`` left
    some replica of the draws fewer microbatches than requested (mixture: a long video dwarfs the rest),
    elsewhere it is the ``paper`` candidate's plan and its time is reused; either way each time equals a
    fresh judge's simulation of the candidate itself."""
    from entrain.sim import choose

    req = ConfigRequest(dataset, "qwen25vl-llama3-1b", 16, 2, 2, 64, 4, seed=0)
    cost = resolve_cost_model(req.model, hardware="a40-paper")
    sampler = dataset_sampler(req.dataset, req.seed)
    paper = replace(
        req, entrain_layout="disjoint", entrain_ramp=0, entrain_split=False, entrain_assignment="paper"
    )
    base = system_setups(["entrain"], paper, cost, sampler)["entrain"]
    cands = {
        "paper": base,
        "requested": replace(base, options={**base.options, "microbatch_count": "requested"}),
    }
    calls = []
    real = choose.fit_memory
    monkeypatch.setattr(choose, "fit_memory", lambda *a, **k: calls.append(1) or real(*a, **k))
    shared = choose.candidate_judge(sampler, cost, req)
    got = {n: shared({n: s})[n] for n, s in cands.items()}
    assert len(calls) == simulated
    fresh = {n: choose.candidate_judge(sampler, cost, req)({n: s})[n] for n, s in cands.items()}
    assert got == fresh
    assert (got["paper"] != got["requested"]) == (simulated == 2)


@pytest.mark.parametrize("recomputes", [False, True])
def test_finer_microbatch_counts_are_candidates_only_where_the_papers_count_recomputes(recomputes):
    """On the deployed check (``judge.deployed``) the ``microbatch count`` decision lists ``requested`` and
    ``double`` only where the paper's count recomputes (``deployed.recomputes``): a finer count buys memory;
    elsewhere ``paper`` alone, whatever the draws would say."""
    cost, base = _base()
    judge, _ = fake_judge({("microbatch count", "double"): 0.9})
    asked = []
    judge.deployed = judge  # type: ignore[attr-defined]
    judge.recomputes = lambda s: asked.append(s.options.get("microbatch_count", "paper")) or recomputes  # type: ignore[attr-defined]
    d = _decisions(entrain_variant(base, REQ, cost, judge))["microbatch count"]
    assert asked == ["paper"]
    assert set(d.candidates) == ({"paper", "requested", "double"} if recomputes else {"paper"})
    assert d.chosen == ("double" if recomputes else "paper")
