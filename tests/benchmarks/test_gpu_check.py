"""benchmarks/gpu_check.py on the CPU: without CUDA one line, status 2, nothing written; the JUnit
counts; the report states what was measured (and what the budget did not reach); the bf16 profile
worker writes a profile that ``--profile`` loads, marked bf16; the exit status is the verdict (1 on a
failed, timed-out or unreached part); each test file has its own timeout and the results of the
others are kept; the point-to-point worker runs ``Transport``'s path between two processes (gloo
here, NCCL on a GPU), and NCCL's refusal of two ranks on one GPU is a reason, not a failure."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from entrain.core.costs.costmodel import CostModel


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
        "p2p": {"status": "refused", "seconds": 9.0, "why": "ncclInvalidUsage: Duplicate GPU detected : rank 1"},
        "tests": [{"file": "tests/runtime/test_gpu_x.py", "status": "failed", "seconds": 95.2, "passed": 11,
                   "failed": 1, "errors": 0, "skipped": 2, "not_passed": ["tests.runtime.test_gpu_x::test_y"]}],
        "profiles": {
            "qwen25vl-llama3-1b": {"method": "entrain profile --precision bf16", "status": "ok",
                                   "out": "/o/gpu_profile_qwen25vl-llama3-1b.json",
                                   "fits": [_fit("layers.0", "fwd", [0.5, 1.25]), _fit("layers.0", "bwd", [1.0, 2.5])]},
            "qwen25vl-llama3-3b": None,
        },
    }  # fmt: skip
    md = gpu_check.render_report(measured)
    assert "Device: NVIDIA H200 (1 visible); torch 2.13.0, CUDA 12.8. Took 301 s of a 480 s budget." in md
    assert "11 passed, 1 failed, 0 errors, 2 skipped; 0 file(s) timed out, 0 not reached." in md
    assert "| `tests/runtime/test_gpu_x.py` | failed | 11 | 1 | 0 | 2 | 95 |" in md
    assert "Not run on this GPU: NCCL refuses two ranks on one GPU: `ncclInvalidUsage: Duplicate GPU" in md
    assert (
        "**Verdict: FAIL** (exit 1): tests/runtime/test_gpu_x.py: failed; profile qwen25vl-llama3-3b: not run."
        in md
    )
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
        "tests": None,
        "profiles": {"qwen25vl-llama3-1b": failed},
    }
    md = gpu_check.render_report(stopped)
    assert md.split("## `pytest -m gpu`")[1].split("##")[0].count("Not run: the budget was spent.") == 1
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


def _file(status: str, **counts) -> dict:
    return {"file": f"tests/x/test_{status.replace(' ', '_')}.py", "status": status, "seconds": 1.0, **counts}


def _measured(p2p="passed", tests=("passed",), profile="ok") -> dict:
    return {
        "p2p": None if p2p is None else {"status": p2p, "seconds": 1.0, "why": "exit [0, 0]"},
        "tests": None if tests is None else [_file(s) for s in tests],
        "profiles": {
            "m": None
            if profile is None
            else {"status": profile, "method": "m", "out": "/o/p.json", "fits": []}
        },
    }


@pytest.mark.parametrize(
    ("measured", "code"),
    [
        (_measured(), 0),
        (_measured(p2p="refused"), 0),  # one GPU: NCCL's refusal is the documented reason
        (_measured(tests=("passed", "failed")), 1),
        (_measured(tests=("timed out", "passed")), 1),
        (_measured(tests=("passed", "not run")), 1),
        (_measured(tests=None), 1),
        (_measured(p2p="failed"), 1),
        (_measured(p2p="timed out"), 1),
        (_measured(p2p=None), 1),
        (_measured(profile="exited 2"), 1),
        (_measured(profile=None), 1),
    ],
)
def test_the_exit_status_is_the_verdict(gpu_check, measured, code):
    assert gpu_check.verdict(measured) == code


def test_main_exits_1_when_a_gpu_test_failed_and_writes_the_report(gpu_check, tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "no_cuda_line", lambda: None)
    info = {"device": "NVIDIA H100", "num_gpus": 1, "torch": "2.13", "cuda": "12.8"}
    for tests, code in ((("passed", "failed"), 1), (("passed",), 0)):
        measured = {**_measured(tests=tests), "device": info, "budget_s": 450.0, "seconds": 100.0}
        monkeypatch.setattr(gpu_check, "measure", lambda *a, m=measured: m)
        assert gpu_check.main(["--out-dir", str(tmp_path), "--models", "m"]) == code
        verdict = "**Verdict: FAIL** (exit 1)" if code else "**Verdict: pass** (exit 0)"
        assert verdict in (tmp_path / "gpu_check.md").read_text()


FAKE_TESTS = {
    "test_ok.py": "def test_a():\n    pass\n\ndef test_b():\n    pass\n",
    "test_hang.py": "import time\n\ndef test_first():\n    pass\n\ndef test_stuck():\n    time.sleep(600)\n",
    "test_bad.py": "def test_good():\n    pass\n\ndef test_wrong():\n    assert 1 == 2\n",
}


def test_each_test_file_has_its_own_timeout_and_the_others_results_are_kept(gpu_check, tmp_path):
    """Fake gpu test files (no CUDA needed): a file stuck in a test is stopped at its timeout, with
    the tests it finished and the one it was in; the files before and after it keep their results."""
    for name, text in FAKE_TESTS.items():
        (tmp_path / name).write_text("import pytest\n\npytestmark = pytest.mark.gpu\n\n" + text)
    files = [str(tmp_path / n) for n in FAKE_TESTS]
    ok, hang, bad = gpu_check.run_gpu_tests(600.0, file_timeout_s=12.0, files=files)
    assert (ok["status"], ok["passed"], ok["failed"]) == ("passed", 2, 0)
    assert (hang["status"], hang["passed"]) == ("timed out", 1)
    assert hang["running"].endswith("test_hang.py::test_stuck")
    assert hang["not_passed"] == [f"{hang['file']}: stopped after 12 s in {hang['running']}"]
    assert (bad["status"], bad["passed"], bad["failed"]) == ("failed", 1, 1)
    assert bad["not_passed"][0].endswith("test_wrong")
    assert gpu_check.verdict({"p2p": {"status": "passed"}, "tests": [ok], "profiles": {}}) == 0
    assert gpu_check.verdict({"p2p": {"status": "passed"}, "tests": [ok, hang, bad], "profiles": {}}) == 1
    rest = gpu_check.run_gpu_tests(0.0, files=files[:1])  # the budget spent: not reached
    assert rest == [
        {"file": files[0], "status": "not run", "seconds": 0.0, "not_passed": [f"{files[0]}: not reached"]}
    ]


def test_the_gpu_test_files_are_found_by_their_mark(gpu_check):
    files = gpu_check.gpu_test_files()
    assert (
        "tests/runtime/test_gpu_exact_gradients.py" in files and "tests/runtime/test_gpu_pipeline.py" in files
    )
    assert "tests/benchmarks/test_gpu_check.py" not in files


def test_the_point_to_point_path_runs_between_two_processes(gpu_check):
    """The worker the GPU check runs on NCCL, here on gloo: warm-up, a header-sized forward message, a
    gradient of known shape back, both checked."""
    result = gpu_check.run_p2p(60.0, backend="gloo")
    assert result["status"] == "passed", result["tail"]


def test_nccl_refusing_two_ranks_on_one_gpu_is_the_reason_not_a_failure(gpu_check, monkeypatch):
    line = "torch.distributed.DistBackendError: ncclInvalidUsage: Duplicate GPU detected : rank 1 and rank 0"
    monkeypatch.setattr(gpu_check, "_start", lambda cmd, env: cmd)
    monkeypatch.setattr(gpu_check, "_finish", lambda proc, timeout_s: (1, "", f"Traceback\n{line}\n"))
    result = gpu_check.run_p2p(60.0)
    assert (result["status"], result["why"]) == ("refused", line)
    monkeypatch.setattr(gpu_check, "_finish", lambda proc, timeout_s: (1, "", "RuntimeError: wrong data\n"))
    assert gpu_check.run_p2p(60.0)["status"] == "failed"
    monkeypatch.setattr(gpu_check, "_finish", lambda proc, timeout_s: (None, "", ""))
    assert gpu_check.run_p2p(60.0)["status"] == "timed out"
