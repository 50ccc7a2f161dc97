"""``entrain export RUN --out DIR`` harms nothing: a non-empty ``DIR`` needs
``--overwrite``; the run folder and the base checkpoint the run was trained from are refused even with
it; the folders are written to a temporary sibling renamed at the end, so a failed export leaves
``DIR`` as it was (and no temporary folder behind)."""

from __future__ import annotations

import json

import pytest

from entrain.cli import export as export_cli
from entrain.cli.main import main
from entrain.core.errors import ConfigError

TRAIN = ["train", "--model", "tiny", "--dataset", "skewed", "--system", "dip", "--global-batch", "2",
         "--microbatch-size", "1", "--steps", "1", "--no-progress"]  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("export-safety") / "run"
    assert main([*TRAIN, "--out", str(out)]) == 0
    return out


def _held(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line_error(capsys, *needles: str) -> None:
    err = capsys.readouterr().err
    assert err.startswith("entrain export: error: ") and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def test_a_non_empty_out_needs_overwrite(run_dir, tmp_path, capsys):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["export", str(run_dir), "--out", str(out)]) == 2
    _one_line_error(capsys, f"--out {out} is not empty", "--overwrite")
    assert _held(out) == {"notes.txt": b"mine"}
    assert main(["export", str(run_dir), "--out", str(out), "--overwrite", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["out"] == str(out) and all(f.startswith(f"{out}/") for f in info["files"])
    assert not (out / "notes.txt").exists() and (out / "llm" / "model.safetensors").exists()
    assert json.loads((out / export_cli.EXPORT_INFO).read_text()) == info
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no temporary folder left


def test_a_failed_export_leaves_out_untouched(run_dir, tmp_path, monkeypatch, capsys):
    """The export fails after the vision and LLM folders are written (the summary's write raises)."""
    kept, fresh = tmp_path / "kept", tmp_path / "fresh"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export_cli, "_write_info", broken)
    for out in (kept, fresh):
        with pytest.raises(OSError, match="disk full"):
            export_cli.export(str(run_dir), str(out), overwrite=True)
    assert _held(kept) == {"notes.txt": b"mine"}
    assert not fresh.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]  # no temporary folder left


def test_the_base_checkpoint_and_the_run_are_never_replaced(run_dir, tmp_path, capsys):
    base = tmp_path / "base"
    assert main(["export", str(run_dir), "--out", str(base)]) == 0
    tuned = tmp_path / "tuned"
    assert main([*TRAIN, "--weights", str(base), "--out", str(tuned)]) == 0
    before = _held(base)
    capsys.readouterr()
    assert main(["export", str(tuned), "--out", str(base), "--overwrite"]) == 2
    _one_line_error(capsys, "would overwrite the base checkpoint the run was trained from (--weights)")
    assert main(["export", str(tuned), "--out", str(tmp_path), "--overwrite"]) == 2  # holds base and run
    _one_line_error(capsys, f"--out {tmp_path} would overwrite the")
    for inside in (base / "llm", base / "sub"):
        assert main(["export", str(tuned), "--out", str(inside), "--overwrite"]) == 2
        _one_line_error(
            capsys, f"--out {inside} is inside the base checkpoint the run was trained from", str(base)
        )
    assert _held(base) == before
    assert main(["export", str(tuned), "--out", str(tuned), "--overwrite"]) == 2
    _one_line_error(capsys, "would overwrite the run folder")
    assert (tuned / "checkpoints").is_dir()


def test_no_folder_inside_or_around_the_run_is_written(run_dir, tmp_path, capsys):
    """``--out RUN/checkpoints --overwrite`` deleted the run's checkpoints (a later --resume started from
    step 0) and ``--out RUN/checkpoints/step-N --overwrite`` replaced that step's files: every folder
    inside the run, the run itself and a folder holding it are refused, on the command line (parse
    time) and by ``export`` itself; the run's files are untouched."""
    before = _held(run_dir)
    (step,) = sorted((run_dir / "checkpoints").iterdir())
    for out in (run_dir / "checkpoints", step, run_dir / "sub", run_dir):
        assert main(["export", str(run_dir), "--out", str(out), "--overwrite"]) == 2
        _one_line_error(capsys, f"--out: cannot write into {out}", f"the run folder {run_dir}")
        with pytest.raises(ConfigError, match=f"--out {out} .* the run folder {run_dir}"):
            export_cli.export(str(run_dir), str(out), overwrite=True)
    assert main(["export", str(run_dir), "--out", str(run_dir.parent), "--overwrite"]) == 2
    _one_line_error(capsys, f"--out {run_dir.parent} would overwrite the run folder {run_dir}")
    assert _held(run_dir) == before and not (run_dir / "sub").exists()


def test_overwrite_never_removes_another_run_inside_out(run_dir, tmp_path, capsys):
    other = tmp_path / "runs" / "other"
    other.mkdir(parents=True)
    (other / "metrics.jsonl").write_text('{"step": 0}\n')
    assert main(["export", str(run_dir), "--out", str(tmp_path / "runs"), "--overwrite"]) == 2
    _one_line_error(capsys, f"--out {tmp_path / 'runs'} would overwrite the run folder {other}")
    assert (other / "metrics.jsonl").read_text() == '{"step": 0}\n'
