"""Journey: a start that fails after the processes started (a truncated weights file while the model
is built, a layout the system cannot run at its first step) leaves nothing that marks ``--out`` as
holding a run, so the same command, run again once the input is fixed, is accepted and trains.
Forked gloo ranks (no torchrun launch); the failure is injected into each rank."""

from __future__ import annotations

import json

import pytest

from entrain.core.errors import ConfigError
from entrain.runtime.run_folder import RUN_MARKERS

from .cli_ranks import run_ranks

ARGV = ["train", "--model", "tiny", "--dataset", "skewed", "--system", "1f1b", "--encoder-stages", "1",
        "--llm-stages", "1", "--global-batch", "2", "--microbatch-size", "1", "--steps", "1", "--no-progress"]  # fmt: skip


def _fail_building_the_model(*args, **kwargs):
    raise ConfigError("--model-path ckpt/model.safetensors: truncated (injected)")


def _fail_the_first_step(self, it):
    raise ConfigError("1f1b cannot run this layout (injected)")


def _injecting(where: str):
    """``run_ranks``' wrap: the rank's CLI call with the failure ``where`` injected."""

    def wrap(run):
        from entrain.runtime import session
        from entrain.runtime.trainer import PipelineTrainer

        if where == "model":
            session._build_model = _fail_building_the_model
        else:
            PipelineTrainer.train_step = _fail_the_first_step
        return run()

    return wrap


@pytest.mark.parametrize("where", ["model", "first step"])
def test_a_failed_start_leaves_no_run_and_the_same_command_is_accepted_again(tmp_path, where):
    out = tmp_path / "run"
    argv = [*ARGV, "--out", str(out)]
    failed = run_ranks(argv, 2, tmp_path / "failed", timeout_s=300, wrap=_injecting(where))
    assert [r.exitcode for r in failed] == [2, 2], failed[0].stderr[-3000:]
    assert "(injected)" in failed[0].stderr
    assert [m for m in RUN_MARKERS if (out / m).exists()] == []
    again = run_ranks(argv, 2, tmp_path / "again", timeout_s=300)
    assert [r.exitcode for r in again] == [0, 0], again[0].stderr[-3000:]
    assert json.loads((out / "config.json").read_text())["resumed_from_step"] == 0
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [0]
