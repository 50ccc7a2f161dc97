"""benchmarks/gpu_check.py on the CPU: without CUDA one line, status 2, nothing written; the JUnit
counts; the report states what was measured (and what the budget did not reach); the bf16 profile
worker writes a profile that ``--profile`` loads, marked bf16."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from entrain.core.costmodel import CostModel


@pytest.fixture(scope="module")
def gpu_check(benchmarks_on_path):
    return importlib.import_module("gpu_check")


def test_without_cuda_one_line_status_2_and_nothing_written(gpu_check, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "results"
    assert gpu_check.main(["--out-dir", str(out), "--budget-s", "60"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "sees no CUDA device" in captured.err
    assert not out.exists()


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.runtime.test_a" name="test_ok" time="1.0"/>
<testcase classname="tests.runtime.test_a" name="test_bad" time="1.0"><failure message="x">tb</failure></testcase>
<testcase classname="tests.runtime.test_b" name="test_two_gpus" time="0"><skipped message="needs 2"/></testcase>
<testcase classname="tests.models.test_c" name="test_boom" time="0"><error message="y">tb</error></testcase>
<testcase classname="tests.models.test_c" name="test_ok2" time="2.0"/>
</testsuite></testsuites>"""


def test_junit_counts(gpu_check):
    counts = gpu_check.junit_counts(JUNIT)
    assert {k: counts[k] for k in ("passed", "failed", "errors", "skipped")} == {
        "passed": 2,
        "failed": 1,
        "errors": 1,
        "skipped": 1,
    }
    assert counts["not_passed"] == ["tests.runtime.test_a::test_bad", "tests.models.test_c::test_boom"]


def _fit(layer: str, phase: str, ms: list[float]) -> dict:
    return {
        "component": "llm",
        "layer": layer,
        "kind": "decoder_layer",
        "phase": phase,
        "tokens": [256, 1024],
        "ms": ms,
    }


def test_report_states_what_was_measured(gpu_check):
    measured = {
        "device": {"device": "NVIDIA H200", "num_gpus": 1, "torch": "2.13.0", "cuda": "12.8"},
        "budget_s": 480.0,
        "seconds": 301.4,
        "tests": {"status": "pytest exited 1", "seconds": 95.2, "passed": 11, "failed": 1, "errors": 0,
                  "skipped": 2, "not_passed": ["tests.runtime.test_gpu_x::test_y"]},
        "profiles": {
            "qwen25vl-llama3-1b": {"method": "entrain profile --precision bf16", "status": "ok",
                                   "out": "/o/gpu_profile_qwen25vl-llama3-1b.json",
                                   "fits": [_fit("layers.0", "fwd", [0.5, 1.25]), _fit("layers.0", "bwd", [1.0, 2.5])]},
            "qwen25vl-llama3-3b": None,
        },
    }  # fmt: skip
    md = gpu_check.render_report(measured)
    assert "Device: NVIDIA H200 (1 visible); torch 2.13.0, CUDA 12.8. Took 301 s of a 480 s budget." in md
    assert "11 passed, 1 failed, 0 errors, 2 skipped in 95 s (pytest exited 1)." in md
    assert "- not passed: `tests.runtime.test_gpu_x::test_y`" in md
    assert "| component | layer | kind | phase | 256 | 1024 |" in md
    assert "| llm | layers.0 | decoder_layer | fwd | 0.500 | 1.250 |" in md
    assert "| llm | layers.0 | decoder_layer | bwd | 1.000 | 2.500 |" in md
    assert "profile `gpu_profile_qwen25vl-llama3-1b.json`" in md
    three_b = md.split("### qwen25vl-llama3-3b")[1]
    assert "Not run: the budget was spent." in three_b and "|" not in three_b
    failed = {
        "method": "m",
        "status": "exited 2",
        "fits": [],
        "tail": "log\nentrain profile: error: no GPU\n",
    }
    stopped = {
        **measured,
        "tests": {"status": "stopped after 240 s", "seconds": 240.0},
        "profiles": {"qwen25vl-llama3-1b": failed},
    }
    md = gpu_check.render_report(stopped)
    assert "No counts: stopped after 240 s (240 s)." in md
    assert "Not measured: exited 2 (m): entrain profile: error: no GPU." in md


def test_bf16_profile_worker_writes_a_usable_profile(gpu_check, tmp_path, capsys):
    out = tmp_path / "tiny.json"
    argv = [
        "--model",
        "tiny",
        "--tokens",
        "8,16",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--out",
        str(out),
        "--json",
    ]
    threads = torch.get_num_threads()
    try:
        assert gpu_check.profile_worker("cpu", argv) == 0
    finally:
        torch.set_num_threads(threads)
    fits = json.loads(capsys.readouterr().out)["fits"]
    assert {f["tokens"][0] for f in fits} == {8}
    profile = CostModel.load(str(out), expect_model="tiny")
    assert profile.notes["precision"] == "bf16"
