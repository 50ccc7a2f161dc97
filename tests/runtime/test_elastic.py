"""A rank SIGKILLed mid-step under ``torchrun --max-restarts``, on a job launched as two torchrun
agents ("nodes", c10d rendezvous on localhost): the group restarts from the last checkpoint and ends
with bitwise the parameters and losses of an uninterrupted run (forked ranks, no torchrun). Two
torchrun launches in all (the two agents)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from entrain.runtime.checkpoint import load_model_state, step_dir

from .cli_ranks import free_port, run_ranks

TRAIN = [
    "train",
    "--model",
    "tiny",
    "--dataset",
    "skewed",
    "--system",
    "entrain",
    "--encoder-stages",
    "1",
    "--llm-stages",
    "1",
    "--dp",
    "2",  # replica r = ranks 2r (encoder), 2r + 1 (LLM): one encoder and one LLM stage per node
    "--global-batch",
    "8",
    "--microbatch-size",
    "1",
    "--steps",
    "4",
    "--checkpoint-every",
    "2",
    "--timeout-s",
    "30",
    "--no-progress",
]

AGENTS_TIMEOUT_S = 300
"""About 56 s on an idle 2-core machine; the margin keeps the test from failing on a loaded one (a
hang still fails it)."""


def _agents(out, logs) -> list[subprocess.Popen]:
    port = free_port()
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        ENTRAIN_FAULT="kill:1:2",  # rank 1 (LLM stage of replica 0) dies in step 2, first attempt only
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
    )
    agents = []
    for node in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2"]
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "elastic-test"]
        cmd += ["--max-restarts", "2", "--monitor-interval", "0.2", "--local-addr", "127.0.0.1"]
        cmd += ["-m", "entrain", *TRAIN, "--resume", "--out", str(out)]
        log = open(logs / f"agent{node}.log", "w")  # noqa: SIM115 - closed by the caller's process end
        agents.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    return agents


@pytest.mark.slow
def test_killed_rank_restarts_from_the_checkpoint_on_two_nodes_bitwise(tmp_path):
    out, logs = tmp_path / "elastic", tmp_path / "logs"
    logs.mkdir()
    agents = _agents(out, logs)
    deadline = time.monotonic() + AGENTS_TIMEOUT_S
    for a in agents:
        try:
            a.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for b in agents:
                b.kill()
            pytest.fail(f"the torchrun agents did not finish within {AGENTS_TIMEOUT_S} s")
    text = "".join((logs / f"agent{n}.log").read_text() for n in range(2))
    assert [a.returncode for a in agents] == [0, 0], text[-4000:]
    assert "resuming entrain from" in text and "(step 2 of 4)" in text
    assert json.loads((out / "config.json").read_text())["resumed_from_step"] == 2

    ref = tmp_path / "reference"
    results = run_ranks([*TRAIN, "--out", str(ref)], 4, tmp_path / "ranks", timeout_s=100)
    assert [r.exitcode for r in results] == [0] * 4, results[0].stderr[-3000:]

    rows = [[json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (out, ref)]
    assert [r["step"] for r in rows[0]] == [0, 1, 2, 3]
    assert [r["loss"] for r in rows[0]] == [r["loss"] for r in rows[1]]
    assert [r["plan_hash"] for r in rows[0]] == [r["plan_hash"] for r in rows[1]]
    _, restarted = load_model_state(step_dir(out, 4))
    _, straight = load_model_state(step_dir(ref, 4))
    assert restarted.keys() == straight.keys() and any(k.startswith("vision.") for k in straight)
    for name, value in straight.items():
        assert torch.equal(restarted[name], value), name
