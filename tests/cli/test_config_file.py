"""``--config FILE.toml`` on ``train``, ``plan`` and ``simulate``: keys are flag
names, the command line wins, bad keys and values are one-line errors, and a run folder's config.json
given back to ``--config`` reproduces the run."""

from __future__ import annotations

import json

import pytest

from entrain.cli.main import build_parser, main, with_config
from entrain.cli.train import _spec

SIM = ["--dataset", "chartqa", "--model", "tiny", "--gpus", "2", "--dp", "1", "--microbatch-size", "2",
       "--systems", "1f1b", "--json"]  # fmt: skip


def _out(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_toml_keys_are_flags_and_the_command_line_wins(tmp_path, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text('global_batch = 8\niterations = 2\nmax_pixels = 200704\nsystems = ["1f1b"]\n')
    flags = ["--global-batch", "8", "--iterations", "2", "--max-pixels", "200704"]
    assert _out(capsys, ["simulate", *SIM, "--config", str(toml)]) == _out(capsys, ["simulate", *SIM, *flags])
    won = _out(capsys, ["simulate", *SIM, "--config", str(toml), "--iterations", "1"])
    assert won == _out(capsys, ["simulate", *SIM, *flags[:2], "--iterations", "1", *flags[4:]])
    plan = ["plan", "--dataset", "chartqa", "--model", "tiny", "--gpus", "2", "--json", "--config", str(toml)]
    assert main(plan) == 0  # plan has no --systems: simulate's key, ignored with a note
    assert "note: --config " in (err := capsys.readouterr().err) and ": ignoring systems " in err
    toml.write_text("global_batch = 8\n")
    assert _out(capsys, plan)["global_batch"] == 8


@pytest.mark.parametrize(
    "text,message",
    [
        ("global_batchh = 8\n", "unknown key 'global_batchh'"),
        ('model = "huge"\n', "model = 'huge': choose from"),
        ('global_batch = "many"\n', "global_batch = 'many'"),
        ("shuffle = 1\n", "shuffle = 1: expected true or false"),
        ("global_batch = [\n", "not valid TOML"),
    ],
)
def test_bad_config_files_are_one_line_errors(tmp_path, capsys, text, message):
    toml = tmp_path / "bad.toml"
    toml.write_text(text)
    assert main(["simulate", *SIM, "--config", str(toml)]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("entrain simulate: error: --config") and message in err and len(err.splitlines()) == 1
    )


def test_run_config_json_reproduces_the_run(tmp_path):
    """config.json's flags give back the spec of the run (the out folder excepted: the command line's)."""
    from dataclasses import replace

    argv = ["train", "--model", "tiny", "--dataset", "skewed", "--system", "dip", "--dp", "1", "--global-batch",
            "4", "--microbatch-size", "2", "--steps", "3", "--lr", "0.002", "--freeze", "vit", "--max-pixels",
            "401408", "--precision", "fp32", "--trace", "--out", str(tmp_path / "a")]  # fmt: skip
    parser = build_parser()
    spec = _spec(parser.parse_args(argv))
    config = {"spec": {}, "flags": spec.run.flags}
    (tmp_path / "config.json").write_text(json.dumps(config))
    again = ["train", "--config", str(tmp_path / "config.json"), "--out", str(tmp_path / "b")]
    parser = build_parser()
    spec2 = _spec(with_config(parser, parser.parse_args(again), again))
    assert spec2 == replace(spec, run=replace(spec.run, out=str(tmp_path / "b")))  # flags: compare=False
    assert spec2.run.flags == {**spec.run.flags, "out": str(tmp_path / "b")}
