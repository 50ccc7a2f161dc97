"""``entrain simulate``: JSON validated against entrain/schemas/simulate.json; table; plots; errors."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from entrain.cli.main import main

SMALL = ["--model", "tiny", "--dataset", "skewed", "--gpus", "8", "--dp", "2", "--global-batch", "32",
         "--microbatch-size", "2", "--iterations", "2"]  # fmt: skip
ALL = "entrain,entrain-1f1b,1f1b,disttrain,dip,dip-greedy"


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(resources.files("entrain").joinpath("schemas/simulate.json").read_text())


def test_json_matches_schema_and_contract(capsys, schema):
    assert main(["simulate", *SMALL, "--systems", ALL, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, schema)
    systems = out["systems"]
    assert list(systems) == ALL.split(",")
    assert out["ideal_ms"] == systems["entrain"]["ideal_ms"]
    assert out["lower_bound_ms"] == systems["entrain"]["lower_bound_ms"]
    for s in systems.values():
        assert len(s["iteration_time_ms_per_iter"]) == 2
        assert s["iteration_time_ms"] == pytest.approx(sum(s["iteration_time_ms_per_iter"]) / 2)
        assert s["iteration_time_ms"] >= s["lower_bound_ms"]
        assert s["peak_activation_bytes"] == max(s["peak_activation_bytes_per_rank"])
        assert len(s["peak_activation_bytes_per_rank"]) == s["config"]["ranks_per_replica"]
    ratio = systems["dip"]["iteration_time_ms"] / systems["entrain"]["iteration_time_ms"]
    assert systems["dip"]["entrain_speedup"] == pytest.approx(ratio)


def test_without_entrain_speedup_is_null(capsys, schema):
    assert main(["simulate", *SMALL, "--systems", "1f1b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, schema)
    assert out["systems"]["1f1b"]["entrain_speedup"] is None


def test_table_and_plots(capsys, tmp_path):
    assert main(["simulate", *SMALL, "--systems", "entrain,dip", "--plot-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "entrain" in text and "dip" in text and "part.ideal" in text
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["fwd_time.png", "gantt_dip.png", "gantt_entrain.png", "memory.png"]
    assert all((tmp_path / n).stat().st_size > 1000 for n in names)


def test_unknown_system_is_a_one_line_error(capsys):
    assert main(["simulate", *SMALL, "--systems", "entrain,megatron"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "megatron" in err[0]


def test_paper_config_for_a_non_paper_case_is_an_error(capsys):
    assert main(["simulate", *SMALL, "--systems", "disttrain-paper"]) == 2
    assert "Table 1" in capsys.readouterr().err


def test_ramp_flag_changes_only_entrain(capsys):
    base = ["simulate", *SMALL, "--systems", "entrain,dip", "--json", "--entrain-layout", "disjoint"]
    assert main([*base, "--ramp-microbatches", "0"]) == 0
    plain = json.loads(capsys.readouterr().out)["systems"]
    assert main([*base, "--ramp-microbatches", "2"]) == 0
    ramp = json.loads(capsys.readouterr().out)["systems"]
    assert ramp["dip"] == {**plain["dip"], "entrain_speedup": ramp["dip"]["entrain_speedup"]}
    assert ramp["entrain"]["iteration_time_ms"] != plain["entrain"]["iteration_time_ms"]


def test_paper_entrain_flag_and_memory_keys(capsys, schema):
    base = ["simulate", *SMALL, "--systems", "entrain,entrain-1f1b,1f1b", "--json"]
    assert main([*base, "--paper-entrain"]) == 0
    paper = json.loads(capsys.readouterr().out)
    paper_flags = ["--entrain-layout", "disjoint", "--ramp-microbatches", "0", "--assignment", "paper"]
    assert main([*base, *paper_flags, "--split-weight-grads", "off"]) == 0
    assert json.loads(capsys.readouterr().out) == paper
    assert main([*base, *paper_flags, "--split-weight-grads", "on"]) == 0  # split weight gradients only
    split = json.loads(capsys.readouterr().out)["systems"]["entrain"]
    assert "split weight grads" in split["config"]["source"]
    # on a GPU preset a split backward is the same work, its gradients only leave earlier: never slower
    # (cpu-tiny prices the split's own cost, LayerCost.split_extra_fraction, measured on the CPU)
    gpu = ["--hardware", "a40-flops", *paper_flags]
    assert main([*base, *gpu, "--split-weight-grads", "off"]) == 0
    whole = json.loads(capsys.readouterr().out)["systems"]["entrain"]
    assert main([*base, *gpu, "--split-weight-grads", "on"]) == 0
    split = json.loads(capsys.readouterr().out)["systems"]["entrain"]
    assert split["iteration_time_ms"] <= whole["iteration_time_ms"]
    assert split["bubble_ratio"] <= whole["bubble_ratio"]
    assert main([*base, "--entrain-layout", "shared"]) == 0
    shared = json.loads(capsys.readouterr().out)
    jsonschema.validate(shared, schema)
    assert shared["systems"]["1f1b"] == {
        **paper["systems"]["1f1b"],
        "entrain_speedup": shared["systems"]["1f1b"]["entrain_speedup"],
    }
    assert "boundary sharing" in shared["systems"]["entrain"]["config"]["source"]
    for s in shared["systems"].values():
        # activations and messages in flight at one step: at least the activations' peak, at most the
        # two peaks together
        acts = [a + m for a, m in zip(s["peak_activation_bytes_per_rank"], s["model_state_bytes_per_rank"])]
        peaks = s["peak_memory_bytes_per_rank"]
        for a, p, x in zip(acts, peaks, s["in_flight_message_bytes_per_rank"]):
            assert a <= p <= a + x
        assert s["fits_memory"] == (max(peaks) <= s["device_memory_bytes"])
    assert main([*base, "--ramp-microbatches", "often"]) == 2
    assert "count >= 0 or 'auto'" in capsys.readouterr().err


def test_a_baseline_that_cannot_be_built_is_named_not_fatal(capsys, schema):
    """16 GPUs at DP 2: DIP's 8 colocated ranks outnumber the tiny encoder's 4 layers; the run goes on,
    ``not_built`` names DIP with the reason and it is no baseline (``best_fitting_baseline``)."""
    argv = ["simulate", *SMALL, "--systems", "entrain,dip,1f1b", "--json"]
    argv[argv.index("--gpus") + 1] = "16"
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, schema)
    assert list(out["systems"]) == ["entrain", "1f1b"]
    assert (
        list(out["not_built"]) == ["dip"] and "cannot split 4 layers into 8 stages" in out["not_built"]["dip"]
    )
    assert out["best_fitting_baseline"] == "1f1b"
    assert main(argv[:-1]) == 0
    assert "dip             does not fit: cannot be built" in capsys.readouterr().out
