"""Multi-rank Entrain resume is exact: a 4-rank run (DP 2 x one encoder and one LLM
stage, forked ranks, no torchrun) that dies in step 1 and is resumed ends with bitwise the
parameters, AdamW state, global RNG streams and per-step sample ids and losses of a straight run.

Every launch starts its processes' Python and numpy generators from its own seed, as fresh
interpreters would (numpy seeds itself from the OS): the resumed run can only continue the straight
run's streams by restoring them from the checkpoint.

On the CPU (gloo, as here) this holds always; on GPUs only with ``--deterministic``
(``tests/runtime/test_checkpoint.py`` has the ``gpu`` test)."""

from __future__ import annotations

import json
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from entrain.runtime.trainer import PipelineTrainer

from .cli_ranks import cli_argv, run_ranks

WORLD = 4
STEPS = 2
TRAIN = cli_argv(
    "train",
    {
        "model": "tiny",
        "dataset": "skewed",
        "system": "entrain",
        "encoder_stages": 1,
        "llm_stages": 1,
        "dp": 2,
        "global_batch": 8,
        "microbatch_size": 2,
        "steps": STEPS,
        "checkpoint_every": 1,
        "timeout_s": 30,
        "no_progress": True,
    },
)


def _peek_streams() -> dict:
    """The next draws of the global Python, numpy and torch generators, leaving them where they were."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    streams = {
        "python": [random.random() for _ in range(4)],
        "numpy": np.random.rand(4).tolist(),
        "torch": torch.rand(4).tolist(),
    }
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])
    return streams


def _instrumented(launch_seed: int, folder: Path):
    """``wrap`` for run_ranks: seeds the launch's generators; after each training step writes the
    rank's parameters, AdamW state and generator streams (the CLI leaves through ``os._exit``)."""

    def wrap(run) -> int:
        rank = int(os.environ["RANK"])
        random.seed(launch_seed * 100 + rank)
        np.random.seed(launch_seed * 100 + rank)
        step = PipelineTrainer.train_step

        def train_step(self, it, **kw):
            result = step(self, it, **kw)
            state = {
                "step_index": self.step_index,
                "params": {n: p.detach().clone() for n, p in self.named_params},
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "streams": _peek_streams(),
            }
            (folder / f"state{rank}.pkl").write_bytes(pickle.dumps(state))
            return result

        PipelineTrainer.train_step = train_step
        return run()

    return wrap


def _launch(argv: list[str], folder: Path, launch_seed: int, env: dict | None = None) -> list:
    results = run_ranks(argv, WORLD, folder, env=env, timeout_s=90.0, wrap=_instrumented(launch_seed, folder))
    return results


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _assert_bitwise(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_bitwise(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_bitwise(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.early  # not slow: benchmarks/mutants.py runs it (-m "not slow")
def test_multirank_entrain_resume_is_bitwise_the_straight_run(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    # the straight run plans each step in line, the resumed one ahead in a background process
    in_line = {"ENTRAIN_PLAN_PREFETCH": "0"}
    for r in _launch([*TRAIN, "--out", str(straight / "run")], straight, launch_seed=1, env=in_line):
        assert r.exitcode == 0, r.stderr[-2000:]
    # the same launch seed as the straight run up to the crash: rank 1 (replica 0's LLM stage) raises
    # in step 1, after the step-1 checkpoint; its peers leave on the broken collective
    crashed = _launch(
        [*TRAIN, "--out", str(resumed / "run")], resumed / "a", 1, {"ENTRAIN_FAULT": "raise:1:1"}
    )
    assert crashed[1].exitcode != 0 and "injected fault at step 1" in crashed[1].stderr
    assert [r["step"] for r in _rows(resumed / "run")] == [0]
    for r in _launch([*TRAIN, "--out", str(resumed / "run"), "--resume"], resumed / "b", launch_seed=2):
        assert r.exitcode == 0, r.stderr[-2000:]

    a, b = _rows(straight / "run"), _rows(resumed / "run")
    assert [r["step"] for r in b] == list(range(STEPS))
    for key in ("sample_ids", "loss", "plan_hash", "grad_norm"):
        assert [r[key] for r in a] == [r[key] for r in b], key
    assert all(r["assignment_wait_ms"] >= 0 for r in a + b)
    assert (straight / "run" / "plan.json").read_text() == (resumed / "run" / "plan.json").read_text()
    for rank in range(WORLD):
        first = pickle.loads((straight / f"state{rank}.pkl").read_bytes())
        again = pickle.loads((resumed / "b" / f"state{rank}.pkl").read_bytes())
        assert first["step_index"] == STEPS and len(first["params"]) > 3, rank
        _assert_bitwise(first, again, f"rank {rank}")
