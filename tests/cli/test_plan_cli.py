"""``entrain plan``: JSON validated against entrain/schemas/plan.json; paper-scale defaults; errors."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from entrain.cli.main import main


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(resources.files("entrain").joinpath("schemas/plan.json").read_text())


def run_json(capsys, argv: list[str]) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def check_consistent(out: dict) -> None:
    cfg = out["config"]
    for comp in cfg["components"].values():
        ranges = comp["layers_per_stage"]
        assert len(ranges) == comp["pp"] == len(comp["stage_time_ms"])
        assert ranges[0][0] == 0 and ranges[-1][1] == len(comp["layer_names"])
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    stages = [t for c in cfg["components"].values() for t in c["stage_time_ms"]]
    eq2 = sum(stages) + (cfg["num_microbatches"] - 1) * max(stages)
    assert out["predicted_iteration_time_ms"] == pytest.approx(eq2)
    assert out["trials"][-1]["batch_size"] >= out["b_min"]
    stable = [t for t in out["trials"] if t["batch_size"] == out["b_min"]]
    assert stable and stable[0]["stable"] and stable[0]["reference"] == out["allocation"]
    assert (
        out["converged"]
        and out["reason"] is None
        and out["b_min"] <= out["max_batch_size"] == out["global_batch"]
    )
    path = [t for t in out["trials"] if out["n0"] <= t["batch_size"] < out["b_min"]]  # doubling path
    assert all(not t["stable"] for t in path)


def test_paper_default_run(capsys, schema):
    out = run_json(capsys, ["--dataset", "synthchartnet", "--model", "qwen25vl-llama3-1b",
                            "--gpus", "64", "--dp", "4", "--tp", "2", "--iterations", "2"])  # fmt: skip
    jsonschema.validate(out, schema)
    check_consistent(out)
    assert out["k_trials"] == 59 and out["b_min"] <= 256
    cfg = out["config"]
    assert cfg["dp"] == 4 and cfg["num_microbatches"] == 512 // (4 * 4)
    enc, llm = cfg["components"]["encoder"], cfg["components"]["llm"]
    assert enc["tp"] == llm["tp"] == 2
    # a40-paper reproduces Table 1's Entrain split for SynthChartNet + Llama-3.2-1B
    assert (enc["pp"], llm["pp"]) == (5, 3)
    assert out["allocation"] == [10, 6]


def test_tiny_cpu_with_extra_sizes(capsys, schema):
    out = run_json(capsys, ["--dataset", "skewed", "--model", "tiny", "--gpus", "2", "--dp", "1",
                            "--global-batch", "16", "--sizes", "1,64"])  # fmt: skip
    jsonschema.validate(out, schema)
    check_consistent(out)
    assert out["hardware"] == "cpu-tiny"
    assert out["allocation"] == [1, 1] and out["b_min"] == 4  # 2 GPUs: always 1:1
    assert {1, 64} <= {t["batch_size"] for t in out["trials"]}


def test_dp_searched_and_workload_file(tmp_path, capsys, schema):
    path = tmp_path / "w.jsonl"
    rows = [{"id": f"s{i}", "images": [[224 + 28 * (i % 7), 448]], "text_tokens": 50 + 13 * (i % 5)}
            for i in range(40)]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = run_json(capsys, ["--dataset", str(path), "--gpus", "16", "--global-batch", "64"])
    jsonschema.validate(out, schema)
    check_consistent(out)
    assert 16 % out["config"]["dp"] == 0


def test_raw_work_file(tmp_path, capsys, schema):
    path = tmp_path / "raw.jsonl"
    path.write_text(
        "\n".join(json.dumps({"id": f"r{i}", "encoder": 10.0 + i % 3, "llm": 10.0}) for i in range(30))
    )
    out = run_json(capsys, ["--dataset", str(path), "--gpus", "8", "--dp", "2", "--global-batch", "32"])
    jsonschema.validate(out, schema)
    assert out["allocation"] == [2, 2]


def test_human_output(capsys):
    """The text report's lines (global batch 32: the same lines as the default 512's, planned faster)."""
    argv = ["--dataset", "cocoqa", "--gpus", "16", "--dp", "1", "--tp", "2", "--iterations", "2",
            "--global-batch", "32"]  # fmt: skip
    assert main(["plan", *argv]) == 0
    text = capsys.readouterr().out
    assert "b_min =" in text and "stable" in text and "predicted iteration time" in text
    assert "stage 0: layers [0," in text


def test_bad_flags(capsys):
    assert main(["plan", "--gpus", "10", "--dp", "4"]) == 2
    assert "not divisible by --dp 4" in capsys.readouterr().err
    assert main(["plan", "--gpus", "16", "--dp", "4", "--global-batch", "30"]) == 2
    assert "not divisible" in capsys.readouterr().err
    assert main(["plan", "--alpha", "1.5"]) == 2
    assert "alpha" in capsys.readouterr().err


def test_plan_and_simulate_share_the_sampler(capsys):
    """One seeded sampler: the same dataset and seed give the same b_min in ``plan`` and ``simulate``
    (before, ``plan`` drew from a fixed pool and ``simulate`` fresh samples: 64 vs 128 here). One
    memory-check draw each: b_min is Algorithm 1's, from the sampler's draws alone."""
    common = ["--dataset", "llava150k", "--model", "qwen25vl-llama3-3b", "--gpus", "16", "--dp", "1",
              "--tp", "2", "--global-batch", "64", "--seed", "0", "--iterations", "1"]  # fmt: skip
    planned = run_json(capsys, common)
    assert main(["simulate", *common, "--systems", "entrain", "--json"]) == 0
    simulated = json.loads(capsys.readouterr().out)["systems"]["entrain"]["config"]
    assert simulated["b_min"] == planned["b_min"]
    assert simulated["dp"] == planned["config"]["dp"]


def test_out_carries_each_systems_layout_for_train(tmp_path, capsys, schema):
    """``--out`` writes the ``--json`` object with the system's layout and schedule options."""
    base = ["plan", "--model", "tiny", "--dataset", "skewed", "--gpus", "4", "--global-batch", "16",
            "--microbatch-size", "1"]  # fmt: skip
    for system, flags in (("entrain", ["--entrain-layout", "shared"]), ("entrain", ["--paper-entrain"]),
                          ("disttrain", []), ("dip", [])):  # fmt: skip
        out = tmp_path / f"{system}.json"
        assert main([*base, "--system", system, *flags, "--out", str(out)]) == 0
        assert "entrain train --plan" in capsys.readouterr().out
        plan = json.loads(out.read_text())
        jsonschema.validate(plan, schema)
        stages = plan["layout"]["stages"]
        assert plan["system"] == system and plan["global_batch"] == 16 and plan["microbatch_size"] == 1
        ranks = 1 + max(s["pp_rank"] for s in stages)
        assert plan["layout"]["dp"] * ranks == 4
        if system == "dip":  # colocated: encoder and LLM chunk r on rank r
            assert {s["pp_rank"] for s in stages if s["component"] == "encoder"} == set(range(ranks))
        if flags == ["--entrain-layout", "shared"]:  # one min-max partition of all layers over the ranks
            assert "boundary sharing" in plan["source"]
            assert [s["pp_rank"] for s in stages] == sorted(s["pp_rank"] for s in stages)
            options, chosen = plan["schedule_options"], {d["name"]: d["chosen"] for d in plan["decisions"]}
            # the options are what the decisions chose
            assert options.get("split_weight_grads", False) is (chosen["split"] == "on")
            assert (options.get("assignment", "paper"), str(options.get("ramp_microbatches", 0))) == (
                chosen["assignment"],
                chosen["ramp"],
            )
            assert options.get("memory_split", True) is (chosen["sub_microbatches"] == "on")
            assert options.get("backward_order", "slot") == chosen["backward_order"]
        if flags == ["--paper-entrain"]:
            assert plan["schedule_options"] == {}


def test_train_refuses_a_bad_plan_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"system": "entrain"}))
    assert main(["train", "--model", "tiny", "--plan", str(bad), "--out", str(tmp_path / "run")]) == 2
    assert "bad.json: model: missing" in capsys.readouterr().err
    good = tmp_path / "good.json"
    assert main(["plan", "--model", "tiny", "--dataset", "skewed", "--gpus", "2", "--global-batch", "8",
                 "--microbatch-size", "1", "--out", str(good)]) == 0  # fmt: skip
    capsys.readouterr()
    assert (
        main(["train", "--model", "qwen25vl-llama3-1b", "--plan", str(good), "--out", str(tmp_path / "r")])
        == 2
    )
    assert "is for model 'tiny'" in capsys.readouterr().err
    assert (
        main(["train", "--model", "tiny", "--plan", str(good), "--nproc", "3", "--out", str(tmp_path / "r")])
        == 2
    )
    assert "runs on 2 processes, but 3 were started" in capsys.readouterr().err
