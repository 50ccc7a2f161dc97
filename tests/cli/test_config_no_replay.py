"""A stored config (a run folder's ``config.json``, or a TOML file) never replays ``--overwrite`` or
``--resume``: they act on the run folder, so only the command line gives them."""

from __future__ import annotations

import json

import pytest

from entrain.cli.main import build_parser, main, with_config
from entrain.runtime.checkpoint import MANIFEST, step_dir

TRAIN = ["train", "--model", "tiny", "--dataset", "skewed", "--system", "dip", "--global-batch", "2",
         "--microbatch-size", "1", "--steps", "1", "--no-progress"]  # fmt: skip


def _parsed(argv: list[str]):
    parser = build_parser()
    return with_config(parser, parser.parse_args(argv), argv)


@pytest.mark.parametrize("kind", ["config.json", "run.toml"])
def test_overwrite_and_resume_are_not_read_from_a_file(tmp_path, capsys, kind):
    path = tmp_path / kind
    if kind == "config.json":
        path.write_text(json.dumps({"spec": {}, "flags": {"steps": 3, "overwrite": True, "resume": True}}))
    else:
        path.write_text("steps = 3\noverwrite = true\nresume = true\n")
    args = _parsed(["train", "--config", str(path), "--out", str(tmp_path / "run")])
    assert args.steps == 3 and not args.overwrite and not args.resume
    err = capsys.readouterr().err
    assert f"--config {path}: ignoring --overwrite, --resume (given only on the command line)" in err
    args = _parsed(["train", "--config", str(path), "--out", str(tmp_path / "run"), "--resume"])
    assert args.resume and not args.overwrite  # the command line still gives them


def test_a_run_started_with_overwrite_is_not_wiped_by_its_config(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")  # an earlier run, replaced on purpose
    assert main([*TRAIN, "--checkpoint-every", "1", "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "config.json").read_text())["flags"]["overwrite"] is True
    held = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert main(["train", "--config", str(out / "config.json")]) == 2
    err = capsys.readouterr().err
    assert "ignoring --overwrite" in err and f"--out {out} holds a run" in err
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == held
    assert (step_dir(out, 1) / MANIFEST).exists()
