"""A run binds to its base checkpoint's content: the resume fingerprint holds the content fingerprint
of ``--model-path`` (config.json, preprocessor_config.json, tensor names / shapes / dtypes), so after
the folder was replaced in place by a wider model ``--resume`` and ``export`` are one line naming the
folder (they were tracebacks from torch's checkpoint loader and ``load_state_dict``); a run from
before the fingerprint stays resumable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from entrain.cli.main import build_parser, main
from entrain.core.errors import ConfigError
from entrain.runtime.checkpoint import check_resumable, checkpoint_dirs


def _save(folder: Path, vision_width: int | None = None) -> Path:
    import tests.models.qwen_vl_tiny as tiny

    configs = tiny._configs

    def wider(*args, **kwargs):
        cfg, cls = configs(*args, **kwargs)
        if vision_width:
            cfg.vision_config.hidden_size, cfg.vision_config.intermediate_size = (
                vision_width,
                2 * vision_width,
            )
        return cfg, cls

    shutil.rmtree(folder, ignore_errors=True)
    tiny._configs = wider
    try:
        return tiny.save_with_tokenizer(folder, "qwen2_5_vl", text_layers=1, vision_depth=1, tied=True)
    finally:
        tiny._configs = configs


def _argv(ckpt: Path, out: Path, steps: int) -> list[str]:
    return ["train", "--model-path", str(ckpt), "--dataset", "skewed", "--system", "dip", "--global-batch", "2",
            "--microbatch-size", "1", "--steps", str(steps), "--no-progress", "--out", str(out)]  # fmt: skip


@pytest.fixture(scope="module")
def changed(tmp_path_factory) -> tuple[Path, Path]:
    """``(checkpoint, run)``: a one-step run, then its checkpoint folder replaced by a wider model."""
    root = tmp_path_factory.mktemp("base")
    ckpt, run = _save(root / "ckpt"), root / "run"
    assert main(_argv(ckpt, run, 1)) == 0
    _save(ckpt, vision_width=64)
    return ckpt, run


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_resume_from_a_changed_base_is_one_line(changed, capsys):
    ckpt, run = changed
    capsys.readouterr()
    assert main([*_argv(ckpt, run, 2), "--resume"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert (
        f"--resume: the checkpoints in {run} were trained from --model-path {ckpt} when it held other" in line
    )


def test_export_from_a_changed_base_is_one_line(changed, tmp_path, capsys):
    ckpt, run = changed
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"{run}: trained from --model-path {ckpt} when it held other content" in line
    assert not (tmp_path / "hf").exists()


def test_a_run_from_before_the_content_fingerprint_stays_resumable(changed, tmp_path):
    from entrain.cli.train import _spec
    from entrain.runtime.checkpointer import fingerprint

    ckpt, run = changed
    old = Path(shutil.copytree(run, tmp_path / "old"))
    (_, folder), *_ = checkpoint_dirs(old)
    manifest = json.loads((folder / "manifest.json").read_text())
    spec = _spec(build_parser().parse_args([*_argv(ckpt, old, 2), "--resume"]))
    with pytest.raises(ConfigError, match="when it held other content"):
        check_resumable(old, fingerprint(spec, "dip"))
    del manifest["fingerprint"]["checkpoint_fingerprint"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert check_resumable(old, fingerprint(spec, "dip")) is not None
