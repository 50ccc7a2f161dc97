"""``entrain train`` with ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (one hardware queue per GPU): a system that
can deadlock there is refused before any process starts, in one line naming the variable and the
systems that are safe with it; a safe system, or ``--device cpu``, goes on."""

from __future__ import annotations

import pytest

from entrain.cli import train as train_cli
from entrain.cli.main import main
from tests.cli.test_train_cli import FAST

ARGS = ["train", *FAST, "--encoder-stages", "1", "--llm-stages", "1", "--nproc", "2"]


def test_train_refuses_a_system_that_deadlocks_on_one_gpu_queue(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    monkeypatch.setattr(train_cli, "_launch", lambda *a: pytest.fail("torchrun was started"))
    assert main([*ARGS, "--system", "entrain", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "CUDA_DEVICE_MAX_CONNECTIONS=1" in err and "entrain" in err
    assert "1f1b, disttrain, disttrain-paper" in err
    launched = []
    monkeypatch.setattr(train_cli, "_launch", lambda *a: launched.append(a) or 0)
    assert main([*ARGS, "--system", "1f1b", "--out", str(tmp_path / "b")]) == 0
    assert main([*ARGS, "--system", "entrain", "--device", "cpu", "--out", str(tmp_path / "c")]) == 0
    assert len(launched) == 2
