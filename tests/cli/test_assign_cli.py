"""``entrain assign``: JSON validated against entrain/schemas/assign.json; raw-work input; errors."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from entrain.cli.main import main


def run_json(capsys, argv: list[str]) -> dict:
    assert main(["assign", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(resources.files("entrain").joinpath("schemas/assign.json").read_text())


def check_iteration_cover(system: dict, batches: list[set[str]]) -> None:
    for it, ids in zip(system["iterations"], batches):
        enc = [s for r in it["replicas"] for mb in r["encoder_microbatches"] for s in mb]
        llm = [s for r in it["replicas"] for mb in r["llm_microbatches"] for s in mb]
        assert sorted(enc) == sorted(llm) == sorted(ids)


def test_builtin_dataset_json_matches_schema(capsys, schema):
    argv = ["--dataset", "synthchartnet", "--dp", "2", "--global-batch", "64", "--microbatch-size", "4",
            "--iterations", "2", "--systems", "entrain,1f1b,disttrain,dip,entrain-1f1b"]  # fmt: skip
    out = run_json(capsys, argv)
    jsonschema.validate(out, schema)
    assert list(out["systems"]) == ["entrain", "1f1b", "disttrain", "dip", "entrain-1f1b"]
    assert out["num_microbatches"] == 8
    for system in out["systems"].values():
        assert len(system["iterations"]) == 2
        assert all(len(it["replicas"]) == 2 for it in system["iterations"])
    e, f = out["systems"]["entrain"], out["systems"]["1f1b"]
    assert e["summary"]["encoder_work_std"] < f["summary"]["encoder_work_std"]
    assert e["iterations"] == out["systems"]["entrain-1f1b"]["iterations"]
    assert run_json(capsys, argv) == out  # deterministic


def test_raw_work_jsonl_input(tmp_path, capsys, schema):
    path = tmp_path / "work.jsonl"
    rows = [
        {"id": f"r{i}", "encoder": float(1 + (i * 7) % 13), "llm": float(1 + (i * 5) % 11)} for i in range(64)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = run_json(capsys, ["--dataset", str(path), "--dp", "2", "--global-batch", "32",
                            "--microbatch-size", "4", "--iterations", "2"])  # fmt: skip
    jsonschema.validate(out, schema)
    assert set(out["systems"]) == {"entrain", "1f1b", "disttrain", "dip"}
    for system in out["systems"].values():
        check_iteration_cover(system, [{f"r{i}" for i in range(32)}, {f"r{i}" for i in range(32, 64)}])
    # works are the file's numbers, summed per microbatch
    first = out["systems"]["1f1b"]["iterations"][0]["replicas"][0]
    assert first["encoder_microbatches"][0] == ["r0", "r1", "r2", "r3"]
    assert first["encoder_work"][0] == pytest.approx(sum(rows[i]["encoder"] for i in range(4)))


def test_human_table_lists_each_system(capsys):
    argv = ["assign", "--dataset", "cocoqa", "--dp", "2", "--global-batch", "32", "--iterations", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for name in ("entrain", "1f1b", "disttrain", "dip", "llm std"):
        assert name in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--global-batch", "30", "--dp", "4"], "not divisible"),
        (["--systems", "entrain,magic"], "unknown system"),
    ],
)
def test_bad_flags_exit_2_with_one_line(capsys, argv, message):
    assert main(["assign", "--iterations", "1", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_short_file_names_both_counts(tmp_path, capsys):
    path = tmp_path / "w.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"x{i}", "encoder": 1.0, "llm": 1.0}) + "\n" for i in range(10))
    )
    assert (
        main(["assign", "--dataset", str(path), "--dp", "1", "--global-batch", "8", "--iterations", "2"]) == 2
    )
    err = capsys.readouterr().err
    assert str(path) in err and "10" in err and "16" in err


def test_dp_defaults_to_the_planners_choice(capsys, schema):
    assert main(["assign", "--iterations", "1", "--global-batch", "64", "--gpus", "16", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    jsonschema.validate(out, schema)
    assert "planner chose dp=" in captured.err
    dp = out["dp"]
    assert 16 % dp == 0 and 64 % (dp * 4) == 0
    assert all(len(it["replicas"]) == dp for s in out["systems"].values() for it in s["iterations"])
