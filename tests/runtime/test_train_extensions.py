"""``entrain train --entrain-layout shared`` / ``--ramp-microbatches`` / ``--assignment``: Entrain's extensions reach the
training Plans (the Plans themselves are proven exact in test_exact_gradients_extensions.py)."""

import pytest

from entrain.cli.main import build_parser
from entrain.cli.train import _spec
from entrain.core.errors import ConfigError
from entrain.runtime.session import build_layout, load_data, resolve_cost


def _layouts(tmp_path, *flags):
    spec = _spec(build_parser().parse_args(["train", "--steps", "1", "--out", str(tmp_path), *flags]))
    cost = resolve_cost(spec)
    probe = load_data(spec, cost, owner=False).train[0]
    return {s: build_layout(spec, s, cost, probe) for s in ("entrain", "1f1b")}


def test_shared_layout_puts_the_boundary_on_one_rank_for_entrain_only(tmp_path):
    layouts = _layouts(tmp_path, "--entrain-layout", "shared")
    ent, base = layouts["entrain"], layouts["1f1b"]
    assert ent.ranks_per_replica == base.ranks_per_replica == 2
    assert len(ent.stages) == 3  # encoder split over both ranks, LLM on the second
    shared_rank = [r for r in range(2) if {s.component for s in ent.stages_of(r)} == {"encoder", "llm"}]
    assert shared_rank == [1]
    assert [(s.component, s.pp_rank) for s in base.stages] == [("encoder", 0), ("llm", 1)]
    n_enc = sum(1 for s in ent.stages if s.component == "encoder")
    enc_ranges = [(s.first_layer, s.end_layer) for s in ent.stages if s.component == "encoder"]
    assert n_enc == 2 and enc_ranges[0][0] == 0 and enc_ranges[0][1] == enc_ranges[1][0]


def test_default_layout_is_the_papers_disjoint_one(tmp_path):
    layouts = _layouts(tmp_path)
    assert [(s.component, s.pp_rank) for s in layouts["entrain"].stages] == [("encoder", 0), ("llm", 1)]


@pytest.mark.parametrize("bad", ["-1", "x"])
def test_bad_ramp_value_is_a_config_error(tmp_path, bad):
    with pytest.raises(ConfigError, match="--ramp-microbatches"):
        _spec(build_parser().parse_args(["train", "--out", str(tmp_path), "--ramp-microbatches", bad]))


def test_split_weight_grads_reaches_entrains_plans_only(tmp_path):
    from entrain.core.plan import ActionKind
    from entrain.runtime.planning import make_plan
    from entrain.runtime.session import schedule_options

    def kinds(flags, system):
        spec = _spec(build_parser().parse_args(["train", "--steps", "1", "--out", str(tmp_path), *flags]))
        cost = resolve_cost(spec)
        probe = load_data(spec, cost, owner=False).train[0]
        plan = make_plan(
            system, build_layout(spec, system, cost, probe), [probe], cost, schedule_options(spec, system)
        )
        return {a.kind for acts in plan.iterations[0].actions.values() for a in acts}

    split = kinds(["--split-weight-grads", "on"], "entrain")
    assert ActionKind.B not in split and {ActionKind.I, ActionKind.W} <= split
    assert ActionKind.B in kinds([], "entrain")  # the paper's schedule by default
    assert ActionKind.B in kinds(["--split-weight-grads", "on"], "1f1b")  # baselines untouched


def test_assignment_reaches_entrains_plans_and_is_recorded(tmp_path):
    from entrain.runtime.planning import make_plan
    from entrain.runtime.session import schedule_options

    def plan(flags, system):
        spec = _spec(build_parser().parse_args(["train", "--steps", "1", "--out", str(tmp_path), *flags]))
        cost = resolve_cost(spec)
        probe = load_data(spec, cost, owner=False).train[0]
        layout = build_layout(spec, system, cost, probe)
        return make_plan(system, layout, [probe], cost, schedule_options(spec, system))

    auto = plan(["--assignment", "auto"], "entrain")
    assert auto.options["assignment"] == "auto"
    assert set(auto.options["assignment_chosen"][0]) <= {"paper", "two-resource"}
    assert "assignment_chosen" not in plan([], "entrain").options  # the paper's by default
    assert "assignment" not in plan(["--assignment", "auto"], "1f1b").options  # baselines untouched
