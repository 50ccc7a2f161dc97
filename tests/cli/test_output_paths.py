"""Every flag that names a file or folder a command writes is probed before any work, through the one
table of output checks (``entrain.cli.argtypes.OUTPUT_CHECKS`` in ``RULES`` / ``PER_COMMAND``): found by
walking the parsers, so a new writing flag without a probe fails ``test_every_writing_flag_is_probed``.
A path that cannot be written, one inside (or over) a training run the command does not own, and one
inside or around the base checkpoint the command reads are one line, exit 2, nothing touched; a path
in a folder that does not exist yet gets its folder made (``entrain data stats --plot new/x.png``
wrote nothing and ended in matplotlib's traceback)."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from entrain.cli import argtypes
from entrain.cli.main import build_parser, main

WRITES = re.compile(r"\b(write|writes|output|save|report|image to)\b", re.IGNORECASE)
"""A flag's help that says it names something written."""
OUTPUT_NAME = re.compile(r"(^|_)(out|output|plot|save|dump|export)")
"""A flag's destination name that says the same."""


def _check(prog: str, action: argparse.Action):
    return argtypes.PER_COMMAND.get((prog, action.dest), argtypes.RULES.get(action.dest))


def _options() -> list[tuple[str, argparse.Action]]:
    """``(command, action)`` of every option that takes a path-like value, of every command."""
    found = []

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):
                    walk(sub)
            elif action.option_strings and action.nargs != 0 and action.choices is None:
                if not isinstance(action.type, argtypes.Number) and action.type not in (int, float):
                    found.append((parser.prog, action))

    walk(build_parser())
    return found


OUTPUTS = [(prog, a) for prog, a in _options() if _check(prog, a) in argtypes.OUTPUT_CHECKS]
IDS = [f"{prog[8:]} {a.option_strings[0]}" for prog, a in OUTPUTS]


def test_every_writing_flag_is_probed():
    looks = {
        (prog, a.dest) for prog, a in _options() if OUTPUT_NAME.search(a.dest) or WRITES.search(a.help or "")
    }
    probed = {(prog, a.dest) for prog, a in OUTPUTS}
    assert looks == probed, f"writing flags without an output check: {looks - probed}"
    assert {(p[8:], a.option_strings[0]) for p, a in OUTPUTS} >= {
        ("data stats", "--plot"), ("data synth", "--out"), ("plan", "--out"), ("simulate", "--plot-dir"),
        ("bench paper", "--out"), ("profile", "--out"), ("train", "--out"), ("export", "--out"),
        ("plot-trace", "--out"),
    }  # fmt: skip
    assert argtypes.OUTPUT_DESTS == {a.dest for _, a in OUTPUTS}


def _name(check, stem: str = "x") -> str:
    """A file or folder name that ``check`` accepts on its own."""
    return {argtypes.output_file: f"{stem}.json", argtypes.image_file: f"{stem}.png"}.get(check, stem)


def _wants_dir(check) -> bool:
    return check in (argtypes.output_dir, argtypes.run_dir_out)


@pytest.fixture
def run(tmp_path):
    """A training run's folder as ``entrain train`` leaves it (config.json, metrics, a checkpoint)."""
    folder = tmp_path / "run"
    step = folder / "checkpoints" / "step-00000002"
    step.mkdir(parents=True)
    (step / "model.safetensors").write_bytes(b"weights")
    (folder / "config.json").write_text(json.dumps({"flags": {"steps": 2}, "fingerprint": {"model": "tiny"}}))
    (folder / "metrics.jsonl").write_text('{"step": 0}\n')
    return folder


def _held(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(capsys, argv: list[str], *needles: str) -> None:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("entrain ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def _command(prog: str) -> list[str]:
    return prog.split()[1:]


@pytest.mark.parametrize(("prog", "action"), OUTPUTS, ids=IDS)
def test_an_output_that_cannot_be_written_is_one_line(prog, action, tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    flag, check = action.option_strings[0], _check(prog, action)
    for value in (str(a_file / _name(check)), "/proc/entrain-probe/" + _name(check)):
        _refused(capsys, [*_command(prog), flag, value], f"argument {flag}: cannot write", value)
    assert a_file.read_text() == "x"


@pytest.mark.parametrize(("prog", "action"), OUTPUTS, ids=IDS)
def test_an_output_never_lands_inside_a_run_it_does_not_own(prog, action, run, capsys):
    flag, check = action.option_strings[0], _check(prog, action)
    before = _held(run)
    step = run / "checkpoints" / "step-00000002"
    inside = [run / "checkpoints", step, run / "sub", run] if check is argtypes.output_dir else []
    if check is argtypes.run_dir_out:  # entrain train --out: its own run (--resume), never another's files
        inside = [run / "checkpoints", step, run / "tensorboard"]
        assert check(str(run)) == str(run) and check(str(run / "entrain")) == str(run / "entrain")
    inside += [] if _wants_dir(check) else [run / "checkpoints" / _name(check), step / "model.safetensors"]
    inside += [] if _wants_dir(check) else [run / "metrics.jsonl", run / "config.json"]
    for path in inside:
        _refused(
            capsys, [*_command(prog), flag, str(path)], f"argument {flag}", str(path), f"the run folder {run}"
        )
    assert _held(run) == before
    if not _wants_dir(check):  # a new file beside the run's own ones: `plot-trace RUN --out RUN/gantt.png`
        assert check(str(run / _name(check, "gantt"))) == str(run / _name(check, "gantt"))


MODEL_PATH_OUTPUTS = [
    (prog, a)
    for prog, a in OUTPUTS
    if any("--model-path" in b.option_strings for _, b in _options() if _ == prog)
]


@pytest.mark.parametrize(
    ("prog", "action"),
    MODEL_PATH_OUTPUTS,
    ids=[f"{p[8:]} {a.option_strings[0]}" for p, a in MODEL_PATH_OUTPUTS],
)
def test_an_output_never_lands_inside_or_around_the_base_checkpoint(prog, action, tmp_path, capsys):
    base = tmp_path / "models" / "base"
    base.mkdir(parents=True)
    (base / "config.json").write_text("{}")
    flag, check = action.option_strings[0], _check(prog, action)
    values = [base / _name(check), base / "sub" / _name(check)]
    values += [base, base.parent] if _wants_dir(check) else []
    for value in values:
        argv = [*_command(prog), "--model-path", str(base), flag, str(value)]
        _refused(capsys, argv, flag, str(value), f"the base checkpoint --model-path {base}")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["base", "config.json", "models"]


@pytest.mark.parametrize(("prog", "action"), OUTPUTS, ids=IDS)
def test_an_output_in_a_missing_folder_gets_its_folder(prog, action, tmp_path):
    """What ``main`` runs before the command (``check_args``) makes the folder the probe accepted."""
    value = tmp_path / "new" / "deeper" / _name(_check(prog, action))
    argtypes.check_args(argparse.Namespace(**{action.dest: str(value)}))
    assert value.parent.is_dir() and not value.exists()


def test_data_stats_plots_into_a_folder_that_does_not_exist_yet(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = [
        "data",
        "stats",
        "--dataset",
        "synthchartnet",
        "--num-samples",
        "40",
        "--plot",
        "no/such/dir/x.png",
    ]
    assert main(argv) == 0
    assert (tmp_path / "no" / "such" / "dir" / "x.png").stat().st_size > 0
    assert "wrote no/such/dir/x.png" in capsys.readouterr().err


def test_bench_papers_numbers_file_is_probed_too(run, tmp_path, capsys):
    """``bench paper --out R.md`` also writes ``R.json``: over a run's plan.json, or over the report
    itself, it is refused before the (minutes long) benchmark runs."""
    before = _held(run)
    _refused(
        capsys,
        ["bench", "paper", "--quick", "--out", str(run / "plan.md")],
        f"--out {run / 'plan.md'}",
        f"the run folder {run}",
    )
    _refused(
        capsys,
        ["bench", "paper", "--quick", "--out", str(tmp_path / "r.json")],
        "give the report another extension",
    )
    assert _held(run) == before and not (tmp_path / "r.json").exists()
