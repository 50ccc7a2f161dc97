"""The device choice and ``--deterministic``: the device rule when a node has fewer GPUs than
processes (``choose_device``), as the CLI applies it before launching; CPU tests force gloo even where
a GPU is visible; ``--deterministic`` reaches the worker. GPUs are simulated by monkeypatching
``torch.cuda.is_available`` / ``device_count``."""

from __future__ import annotations

import argparse
import os
import re

import pytest
import torch

from entrain.cli import train as train_cli
from entrain.cli.main import main
from entrain.cli.train_args import DEFAULTS, child_argv
from entrain.core.errors import ConfigError
from entrain.runtime.distributed import DEVICE_ENV, choose_device, device_from_env, own_gpu_only
from entrain.runtime.preflight import resolve_device
from tests.cli.test_train_cli import FAST
from tests.runtime.harness import run_workers


def _gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(
    ("requested", "procs", "gpus", "kind"),
    [
        ("auto", 2, 2, "cuda"),
        ("auto", 1, 0, "cpu"),
        ("cpu", 1, 8, "cpu"),
        ("cuda", 4, 8, "cuda"),
    ],
)
def test_enough_gpus_or_cpu_needs_no_note(requested, procs, gpus, kind):
    assert choose_device(requested, procs, gpus) == (kind, None)


def test_auto_with_more_processes_than_gpus_falls_back_to_gloo_with_a_note():
    kind, note = choose_device("auto", 2, 1)
    assert kind == "cpu"
    assert "2 processes on this node need 2 GPUs (one each), 1 visible" in note and "\n" not in note


@pytest.mark.parametrize(
    ("gpus", "needle"), [(1, "need 2 GPUs (one each), 1 visible"), (0, "no GPU is visible")]
)
def test_explicit_cuda_with_too_few_gpus_is_refused_with_the_count(gpus, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        choose_device("cuda", 2, gpus)


def test_two_local_ranks_on_one_gpu_land_on_cpu_not_twice_on_cuda_0(monkeypatch):
    _gpus(monkeypatch, 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the node's one GPU, shared
    monkeypatch.delenv(DEVICE_ENV)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert device_from_env() == torch.device("cpu")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert device_from_env() == torch.device("cuda", 0)
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert device_from_env() == torch.device("cpu")


def test_train_refuses_cuda_on_too_few_gpus_before_launching(monkeypatch, capsys):
    _gpus(monkeypatch, 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(train_cli, "_launch", lambda *a: pytest.fail("torchrun was started"))
    argv = ["train", *FAST, "--encoder-stages", "1", "--llm-stages", "1", "--nproc", "2", "--device", "cuda"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "2 processes on this node need 2 GPUs (one each), 1 visible" in err


def test_train_auto_launches_gloo_workers_with_a_note(monkeypatch, capsys):
    _gpus(monkeypatch, 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(DEVICE_ENV, "auto")
    launched = {}

    def launch(args, spec, nproc: int) -> int:
        launched.update(n=nproc, env=dict(os.environ))
        return 0

    monkeypatch.setattr(train_cli, "_launch", launch)
    assert main(["train", *FAST, "--encoder-stages", "1", "--llm-stages", "1", "--nproc", "2"]) == 0
    assert launched["n"] == 2 and launched["env"][DEVICE_ENV] == "cpu"
    assert "running on CPU with gloo" in capsys.readouterr().err


@pytest.mark.parametrize("requested", ["auto", "cuda"])
def test_a_process_shown_only_its_own_gpu_uses_it_as_device_0(monkeypatch, requested):
    """A launcher that sets ``CUDA_VISIBLE_DEVICES`` per rank: each of the node's 4 processes sees one
    GPU, its own, as device 0 (not ``cuda:LOCAL_RANK``, and not a fall-back to CPU and gloo)."""
    _gpus(monkeypatch, 1)
    monkeypatch.setenv(DEVICE_ENV, requested)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5f2e")
    assert device_from_env() == torch.device("cuda", 0)
    assert resolve_device(requested, 4, say=False) == "cuda"  # as the worker resolves it
    monkeypatch.setenv(DEVICE_ENV, requested)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # two names but torch sees one: not its own
    if requested == "auto":
        assert device_from_env() == torch.device("cpu")
    else:
        with pytest.raises(ConfigError, match="4 processes on this node need 4 GPUs"):
            device_from_env()


def test_a_node_with_a_gpu_per_process_uses_the_local_rank(monkeypatch):
    _gpus(monkeypatch, 4)
    monkeypatch.delenv(DEVICE_ENV)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert device_from_env() == torch.device("cuda", 3)


@pytest.mark.parametrize("value", [None, "", "0,1", " , "])
def test_own_gpu_needs_exactly_one_visible_device_named(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert not own_gpu_only()
    assert choose_device("auto", 2, 1, own_gpu_only())[0] == "cpu"


def _broken_cuda():
    raise RuntimeError("CUDA driver initialization failed")


@pytest.mark.parametrize("broken", [False, True])
def test_train_device_cuda_without_a_usable_gpu_is_one_line(monkeypatch, capsys, broken):
    _gpus(monkeypatch, 0)
    if broken:  # torch sees a GPU but cannot use it
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", _broken_cuda)
    monkeypatch.setattr(train_cli, "_launch", lambda *a: pytest.fail("torchrun was started"))
    argv = ["train", *FAST, "--encoder-stages", "1", "--llm-stages", "1", "--nproc", "2", "--device", "cuda"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--device cuda: no GPU is visible" in err


def _backend(env):
    return env.backend, str(env.device)


def test_the_harness_forces_gloo_where_a_gpu_is_visible(monkeypatch, tmp_path):
    _gpus(monkeypatch, 1)
    monkeypatch.delenv(DEVICE_ENV)  # only the harness's own choice counts here
    assert run_workers(_backend, 1, tmp_path) == [("gloo", "cpu")]


def test_deterministic_reaches_the_worker(monkeypatch, tmp_path):
    """The in-process (1-rank) worker runs with torch's deterministic algorithms on; the flag is in
    the resume fingerprint. On CPU a resumed run is bitwise equal with or without it; on GPU only
    with it (``docs/architecture.md``)."""
    from entrain.runtime import session
    from entrain.runtime.checkpointer import fingerprint

    seen = {}

    def record(spec, env, **_):
        seen.update(on=torch.are_deterministic_algorithms_enabled(), fp=fingerprint(spec, "dip"))
        return []

    monkeypatch.setattr(session, "run_systems", record)
    try:
        assert main(["train", *FAST, "--system", "dip", "--out", str(tmp_path / "r"), "--deterministic"]) == 0
    finally:
        torch.use_deterministic_algorithms(False)
    assert seen == {"on": True, "fp": {**seen["fp"], "deterministic": True}}
    worker_args = argparse.Namespace(**{**DEFAULTS, "deterministic": True})
    assert "--deterministic" in child_argv(worker_args)  # torchrun workers get it too
