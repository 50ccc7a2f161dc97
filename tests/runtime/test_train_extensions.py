"""``entrain train``'s layouts: Entrain's extensions (``--entrain-layout``, ``--ramp-microbatches``,
``--split-weight-grads``, ``--assignment``) reach the training Plans with the defaults ``simulate`` uses,
baselines stay untouched, and fixed stage counts go through Algorithm 2's partitioner (the Plans
themselves are proven exact in test_exact_gradients_extensions.py)."""

import pytest

from entrain.cli import train_worker
from entrain.cli.main import build_parser
from entrain.cli.train import _spec
from entrain.core.ir.plan import ActionKind
from entrain.runtime.planning import make_plan, run_setups
from entrain.runtime.run_data import load_data

FIXED = ["--encoder-stages", "1", "--llm-stages", "1"]


def _setups(tmp_path, *flags, systems="entrain,1f1b", gpus=2):
    spec = _spec(build_parser().parse_args(["train", "--steps", "1", "--out", str(tmp_path), "--system", systems,
                                            *flags]))  # fmt: skip
    cost = spec.model.cost_model()
    data = load_data(spec, cost, owner=False)
    return run_setups(spec, cost, data.train, gpus), cost, data.train[0]


def test_shared_layout_puts_the_boundary_on_one_rank_for_entrain_only(tmp_path):
    setups, _, _ = _setups(tmp_path, *FIXED, "--entrain-layout", "shared")
    ent, base = setups["entrain"].layout, setups["1f1b"].layout
    assert ent.ranks_per_replica == base.ranks_per_replica == 2
    assert len(ent.stages) == 3  # encoder split over both ranks, LLM on the second
    shared_rank = [r for r in range(2) if {s.component for s in ent.stages_of(r)} == {"encoder", "llm"}]
    assert shared_rank == [1]
    assert [(s.component, s.pp_rank) for s in base.stages] == [("encoder", 0), ("llm", 1)]
    n_enc = sum(1 for s in ent.stages if s.component == "encoder")
    enc_ranges = [(s.first_layer, s.end_layer) for s in ent.stages if s.component == "encoder"]
    assert n_enc == 2 and enc_ranges[0][0] == 0 and enc_ranges[0][1] == enc_ranges[1][0]


def test_disjoint_layout_is_the_papers(tmp_path):
    setups, _, _ = _setups(tmp_path, *FIXED, "--entrain-layout", "disjoint")
    assert [(s.component, s.pp_rank) for s in setups["entrain"].layout.stages] == [("encoder", 0), ("llm", 1)]


@pytest.mark.parametrize("bad", ["-1", "x"])
def test_bad_ramp_value_is_refused_by_the_parser(tmp_path, bad, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--out", str(tmp_path), "--ramp-microbatches", bad])
    assert "--ramp-microbatches" in capsys.readouterr().err


def test_split_weight_grads_reaches_entrains_plans_only(tmp_path):
    def kinds(flags, system):
        setups, cost, probe = _setups(tmp_path, *FIXED, *flags, systems=system)
        setup = setups[system]
        plan = make_plan(system, setup.layout, [probe], cost, setup.options)
        return {a.kind for acts in plan.iterations[0].actions.values() for a in acts}

    split = kinds([], "entrain")  # on by default, as in entrain simulate
    assert ActionKind.B not in split and {ActionKind.I, ActionKind.W} <= split
    assert ActionKind.B in kinds(["--split-weight-grads", "off"], "entrain")
    assert ActionKind.B in kinds(["--paper-entrain"], "entrain")
    assert ActionKind.B in kinds([], "1f1b")  # baselines untouched


def test_without_fixed_stages_train_plans_as_simulate_does(tmp_path):
    """Same planner, same defaults: train's setups on 4 processes are entrain simulate's on 4 GPUs."""
    from entrain.cli.simulate import simulate_systems

    common = ["--model", "tiny", "--dataset", "skewed", "--global-batch", "8", "--microbatch-size", "1"]
    systems = "entrain,1f1b,dip"
    spec = _spec(build_parser().parse_args(["train", *common, "--steps", "2", "--out", str(tmp_path),
                                            "--system", systems]))  # fmt: skip
    cost = spec.model.cost_model()
    seen = []

    def memory_check(
        system, setup, batches, cost, margin=None
    ):  # train's CLI passes simulate's (memory_fit.deploy)
        seen.append((system, len(batches)))
        return train_worker._memory_check(system, setup, batches, cost, margin)

    # and its layout judge (sim.choose.candidate_judge), as train's CLI passes both
    planned = run_setups(
        spec, cost, load_data(spec, cost, owner=False).train, 4, memory_check, train_worker._judge_factory
    )
    # every memory-fitted system (DIP's check changes nothing), on plan's 20 draws, not the run's 2 batches
    assert seen == [("entrain", 20), ("1f1b", 20)]
    sim_args = build_parser().parse_args(
        ["simulate", *common, "--gpus", "4", "--iterations", "2", "--systems", systems]
    )
    runs, described = simulate_systems(sim_args, systems.split(","))
    for system in systems.split(","):
        assert planned[system].layout == runs[system].layout, system
        assert planned[system].layout.world_size == 4
        assert planned[system].source == described[system]["source"]
    assert planned["entrain"].b_min is not None and "Algorithm 1+2" in planned["entrain"].source


def test_assignment_reaches_entrains_plans_and_is_recorded(tmp_path):
    def plan(flags, system):
        setups, cost, probe = _setups(tmp_path, *FIXED, *flags, systems=system)
        setup = setups[system]
        return make_plan(system, setup.layout, [probe], cost, setup.options)

    auto = plan([], "entrain")  # auto by default, as in entrain simulate
    assert auto.options["assignment"] == "auto"
    assert set(auto.options["assignment_chosen"][0]) <= {"paper", "two-resource"}
    assert "assignment_chosen" not in plan(["--paper-entrain"], "entrain").options
    assert "assignment" not in plan([], "1f1b").options  # baselines untouched


def test_train_plans_under_the_pixel_limits_as_simulate_does(tmp_path):
    """``--max-pixels`` reaches train's planner draws (on text-heavy data with small images
    train once planned for full-size ones and left Entrain's boundary rank only the LLM embedding)."""
    from entrain.cli.simulate import simulate_systems

    common = ["--model", "tiny", "--dataset", "text-heavy", "--max-pixels", str(224 * 224), "--global-batch", "24",
              "--microbatch-size", "4"]  # fmt: skip
    spec = _spec(build_parser().parse_args(["train", *common, "--steps", "1", "--out", str(tmp_path),
                                            "--system", "entrain"]))  # fmt: skip
    cost = spec.model.cost_model()
    train = load_data(spec, cost, owner=False).train
    planned = run_setups(spec, cost, train, 2, judge_factory=train_worker._judge_factory)["entrain"].layout
    sim_args = build_parser().parse_args(
        ["simulate", *common, "--gpus", "2", "--iterations", "1", "--systems", "entrain"]
    )
    runs, _ = simulate_systems(sim_args, ["entrain"])
    assert planned == runs["entrain"].layout
    llm_on_rank0 = [(s.first_layer, s.end_layer) for s in planned.stages_of(0) if s.component == "llm"]
    assert llm_on_rank0 == [(0, 2)]  # the embedding and the first decoder layer
