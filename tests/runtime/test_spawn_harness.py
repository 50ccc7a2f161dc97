"""The ``gpu`` tests' machinery, exercised on the CPU: spawned workers (``gpu_harness``) rendezvous,
return their results with tensors on the CPU and report a failing rank's traceback; scenarios fail
one by one; the ``gpu`` marker skips where torch sees too few GPUs (``tests/conftest.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from .gpu_harness import cpu_tensors, each_scenario, run_spawned, scenario

pytest_plugins = ["pytester"]


def _sum_ranks(env, fail_rank: int | None) -> dict:
    t = torch.tensor([float(env.rank + 1)], device=env.device)
    dist.all_reduce(t)
    if env.rank == fail_rank:
        raise ValueError(f"planted failure on rank {fail_rank}")
    return {"rank": env.rank, "sum": t, "backend": env.backend}


def test_spawned_workers_rendezvous_and_report(tmp_path):
    results = run_spawned(_sum_ranks, 2, tmp_path / "ok", None, timeout_s=120)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["sum"].item() == 3.0 and r["sum"].device.type == "cpu" for r in results)
    with pytest.raises(AssertionError, match="rank 1 failed:(.|\n)*planted failure on rank 1"):
        run_spawned(_sum_ranks, 2, tmp_path / "fail", 1, timeout_s=120, pg_timeout_s=20)


def test_scenarios_fail_one_by_one_and_tensors_come_back_on_the_cpu():
    out = each_scenario({"good": lambda: 1, "bad": lambda: 1 / 0})
    assert scenario(out, "good") == 1
    with pytest.raises(AssertionError, match="scenario bad failed(.|\n)*ZeroDivisionError"):
        scenario(out, "bad")
    moved = cpu_tensors({"a": [torch.ones(2, requires_grad=True)], "b": (3, "x")})
    assert moved["b"] == (3, "x") and not moved["a"][0].requires_grad


GPU_TESTS = """
import pytest

@pytest.mark.gpu
def test_one_gpu():
    pass

@pytest.mark.gpu(min_gpus=2)
def test_two_gpus():
    pass

def test_cpu():
    pass
"""


@pytest.mark.parametrize(
    ("num_gpus", "outcomes", "reason"),
    [
        (0, {"skipped": 2}, "torch sees no CUDA device"),
        (1, {"passed": 1, "skipped": 1}, "needs 2 CUDA devices, torch sees 1"),
        (2, {"passed": 2}, None),
    ],
)
def test_gpu_marker_skips_with_a_reason_and_is_selected_by_m_gpu(
    pytester, monkeypatch, request, num_gpus, outcomes, reason
):
    pytester.makeconftest((request.config.rootpath / "tests" / "conftest.py").read_text())
    pytester.makepyfile(GPU_TESTS)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: num_gpus)
    result = pytester.runpytest_inprocess("-m", "gpu", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(deselected=1, **outcomes)
    if reason:
        result.stdout.fnmatch_lines([f"*gpu test: {reason}*"])
