"""What a machine with a GPU checks, in one script, within a time budget; its exit status is the
verdict.

1. The pipeline's point-to-point path (``entrain.runtime.comm.Transport``: the channel warm-up, a
   forward message read by its header, a gradient of known shape) between two processes on NCCL:
   on two GPUs one each; on one GPU both on it, which NCCL refuses ("Duplicate GPU detected"): the
   report then records NCCL's own words as the reason the path did not run there (not a failure;
   the two-GPU tests below cover it where there are two).
2. ``pytest -m gpu``, one test file at a time, each with its own timeout (``--file-timeout-s``): a
   file that runs past it counts as timed out, the results of the tests it finished (its ``-v``
   lines) and of every other file are kept. Pass / fail / skip counts per file.
3. ``entrain profile`` of real-size ``qwen25vl-llama3-1b`` and ``qwen25vl-llama3-3b`` layers (one
   layer per kind, random weights) in bf16 on ``cuda``: profile JSONs usable with ``--profile``
   (``gpu_profile_MODEL.json``). ``profile_bf16`` alone decides how (``entrain profile --precision
   bf16`` where the CLI has the flag; else the profiler under bf16 autocast in a child process).
4. ``gpu_check.md``: the device, torch and CUDA versions, each part's outcome and the per-layer times
   at each size measured, only what was measured (a part the budget did not reach says so).

Each part has its share of ``--budget-s`` (default 450 s: under 8 minutes with the start) and is
stopped when it runs past it. Exit status (``verdict``): 0 when every part ran and passed; 1 when a
gpu test failed, errored or timed out, a test file or profile was not reached within the budget, a
profile failed, or the point-to-point path failed; 2 without CUDA (one line, nothing written).

    python benchmarks/gpu_check.py [--out-dir benchmarks/results] [--budget-s 450] [--file-timeout-s 150]
        [--models qwen25vl-llama3-1b,qwen25vl-llama3-3b] [--tokens 256,1024,4096,8192]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MODELS = ("qwen25vl-llama3-1b", "qwen25vl-llama3-3b")
TOKENS = "256,1024,4096,8192"
TESTS_SHARE = 0.55
"""Share of the budget for ``pytest -m gpu``; the profiles split what is left."""
FILE_TIMEOUT_S = 150.0
"""Longest run of one gpu test file (``--file-timeout-s``)."""
P2P_TIMEOUT_S = 90.0
"""Longest run of the point-to-point part (two processes, NCCL start-up included)."""
BUDGET_S = 450.0
MIN_PART_S = 30.0
"""A part with less time than this left is not started."""
REPORT = "gpu_check.md"


def no_cuda_line() -> str | None:
    """The one-line reason to stop when torch sees no GPU (None: there is one)."""
    import torch

    if torch.cuda.is_available():
        return None
    return f"gpu_check: torch {torch.__version__} sees no CUDA device; nothing run, nothing written"


def device_info() -> dict:
    import torch

    return {
        "device": torch.cuda.get_device_name(0),
        "num_gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def _env() -> dict:
    """The children import this checkout's ``entrain`` and find the test packages."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), path) if p)}


def _start(cmd: list[str], env: dict | None = None) -> subprocess.Popen:
    """``cmd`` in its own process group (killed whole at its deadline, spawned workers included);
    ``env``: variables on top of this process's."""
    return subprocess.Popen(
        cmd, cwd=REPO, env={**_env(), **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip


def _finish(proc: subprocess.Popen, timeout_s: float) -> tuple[int | None, str, str]:
    """(exit status, or None when stopped at ``timeout_s``; stdout; stderr)."""
    try:
        out, err = proc.communicate(timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err
    return proc.returncode, out, err


def _run(cmd: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    """``cmd`` stopped after ``timeout_s`` (``_finish``)."""
    return _finish(_start(cmd), timeout_s)


# --- 1. the gpu tests --------------------------------------------------------------------------------
def junit_counts(xml_text: str) -> dict:
    """Per outcome the number of test cases in a JUnit XML report, and the failed / errored ids."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "not_passed": []}
    for case in ET.fromstring(xml_text).iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = next(
            (key for tag, key in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped"))
             if case.find(tag) is not None),
            "passed",
        )  # fmt: skip
        counts[outcome] += 1
        if outcome in ("failed", "errors"):
            counts["not_passed"].append(name)
    return counts


_VERBOSE = re.compile(r"^(\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.MULTILINE)
_OUTCOME = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "errors"}


def verbose_counts(text: str) -> dict:
    """``junit_counts`` from ``pytest -v`` lines (what a run stopped at its timeout printed), with
    ``running``: the test it was in when stopped (None: between tests)."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "not_passed": []}
    for name, word in _VERBOSE.findall(text):
        outcome = _OUTCOME.get(word, "skipped")
        counts[outcome] += 1
        if outcome in ("failed", "errors"):
            counts["not_passed"].append(name)
    last = [x for x in text.splitlines() if x.strip()][-1:]
    running = re.match(r"^(\S+::\S+)\s*$", last[0]) if last else None
    return {**counts, "running": running.group(1) if running else None}


_GPU_MARK = re.compile(r"^(@pytest\.mark\.gpu\b|pytestmark\s*=.*\bpytest\.mark\.gpu\b)", re.MULTILINE)


def gpu_test_files(root: Path = REPO / "tests") -> list[str]:
    """The test files with a ``gpu`` mark, relative to the checkout."""
    found = (p for p in sorted(root.rglob("test_*.py")) if _GPU_MARK.search(p.read_text()))
    return [str(p.relative_to(REPO)) for p in found]


def run_test_file(path: str, timeout_s: float) -> dict:
    """``pytest -v -m gpu PATH`` stopped after ``timeout_s``: its ``status`` (``passed``, ``failed``
    or ``timed out``), counts, the tests not passed and the time it took."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-v",
            "-m",
            "gpu",
            path,
            f"--junitxml={xml}",
            "-p",
            "no:cacheprovider",
        ]
        t0 = time.monotonic()
        code, out, err = _run(cmd, timeout_s)
        seconds = time.monotonic() - t0
        report = xml.read_text() if code is not None and xml.exists() else None
    base = {"file": path, "seconds": seconds, "tail": (out + err)[-2000:]}
    if code is None:
        counts = verbose_counts(out)
        where = f" in {counts['running']}" if counts["running"] else ""
        counts["not_passed"].append(f"{path}: stopped after {timeout_s:.0f} s{where}")
        return {**base, "status": "timed out", **counts}
    if report is None:
        return {
            **base,
            "status": "failed",
            **verbose_counts(out),
            "why": f"pytest exited {code} without a report",
        }
    counts = junit_counts(report)
    ok = code in (0, 5) and not counts["failed"] and not counts["errors"]  # 5: every test deselected
    return {**base, "status": "passed" if ok else "failed", **counts, "why": f"pytest exited {code}"}


def run_gpu_tests(
    budget_s: float, file_timeout_s: float = FILE_TIMEOUT_S, files: list[str] | None = None
) -> list[dict]:
    """Every gpu test file in turn, each stopped after ``file_timeout_s`` (or what is left of
    ``budget_s``); a file the budget does not reach is ``not run``."""
    t0, out = time.monotonic(), []
    for path in gpu_test_files() if files is None else files:
        left_s = budget_s - (time.monotonic() - t0)
        if left_s < MIN_PART_S:
            out.append(
                {"file": path, "status": "not run", "seconds": 0.0, "not_passed": [f"{path}: not reached"]}
            )
            continue
        out.append(run_test_file(path, min(file_timeout_s, left_s)))
    return out


# --- 2. the point-to-point path ----------------------------------------------------------------------
DUPLICATE_GPU = "Duplicate GPU detected"
"""NCCL's words when two ranks of a communicator share a GPU."""


def p2p_worker(rank: int, store: str, backend: str) -> int:
    """``--p2p-worker RANK STORE BACKEND``: one of two ranks on ``Transport``'s path: the channel
    warm-up, rank 0 sends a forward message (read by its header), rank 1 returns a gradient of known
    shape; both check what arrived. On ``nccl`` every rank uses GPU ``rank % device_count``."""
    import torch
    import torch.distributed as dist

    from entrain.core.ir.p2p import channel_warmup
    from entrain.runtime.comm import MessageKey, Transport

    device = (
        torch.device("cuda", rank % torch.cuda.device_count()) if backend == "nccl" else torch.device("cpu")
    )
    kwargs = {"device_id": device} if backend == "nccl" else {}
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=2, **kwargs)
    groups = {(0, 1): dist.new_group([0, 1]), (1, 0): dist.new_group([0, 1])}
    transport = Transport(device, 60.0, channel_group=lambda s, d: groups[(s, d)], me=rank)
    transport.warm_up(channel_warmup(list(groups), rank))
    fwd, bwd, ids = MessageKey(0, False, 0, 0), MessageKey(1, True, 0, 0), ["s0", "s1"]
    acts = torch.arange(15, dtype=torch.float32, device=device).reshape(3, 5)
    if rank == 0:
        transport.send(acts, 1, fwd, ids)
        transport.receive(1, bwd, ids, like=acts)
        got = transport.take(1, bwd)
    else:
        transport.receive(0, fwd, ids)
        got = transport.take(0, fwd)
        transport.send(got * 2, 0, bwd, ids)
    transport.wait_all()
    want = acts * 2 if rank == 0 else acts
    ok = bool(torch.equal(got, want))
    dist.destroy_process_group()
    print(f"p2p rank {rank}: {'ok' if ok else 'wrong data'}", flush=True)
    return 0 if ok else 1


def run_p2p(timeout_s: float, backend: str = "nccl") -> dict:
    """Two ``--p2p-worker`` processes: ``status`` ``passed``, ``failed``, ``timed out`` or, NCCL
    refusing two ranks on one GPU, ``refused`` with NCCL's line as ``why``."""
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "store")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--p2p-worker"]
        t0 = time.monotonic()
        nccl_says = {"NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN")}  # its refusal, in its words
        procs = [_start([*cmd, str(r), store, backend], nccl_says) for r in (0, 1)]
        results = [_finish(p, timeout_s - (time.monotonic() - t0)) for p in procs]
    seconds = time.monotonic() - t0
    text = "".join(out + err for _, out, err in results)
    codes = [code for code, _, _ in results]
    refusal = [x.strip() for x in text.splitlines() if DUPLICATE_GPU in x][:1]
    if refusal:
        status = "refused"
    elif None in codes:
        status = "timed out"
    else:
        status = "passed" if codes == [0, 0] else "failed"
    return {
        "status": status,
        "seconds": seconds,
        "why": refusal[0] if refusal else f"exit {codes}",
        "tail": text[-2000:],
    }


# --- 3. the bf16 profiles ----------------------------------------------------------------------------
@functools.cache
def cli_has_precision() -> bool:
    """Whether ``entrain profile`` takes ``--precision``."""
    code, out, _ = _run([sys.executable, "-m", "entrain", "profile", "--help"], 120)
    return code == 0 and "--precision" in out


def profile_bf16(model: str, out: Path, tokens: str, budget_s: float) -> dict:
    """Profile ``model``'s layers in bf16 on ``cuda`` into ``out`` (a ``--profile`` JSON), stopped
    after ``budget_s``: ``entrain profile --precision bf16`` where the CLI has the flag, else the
    profiler under bf16 autocast (``--profile-worker``). Returns ``{"method", "status", "fits"}``
    (``fits``: ``entrain profile --json``'s, empty when it did not finish)."""
    common = ["--model", model, "--tokens", tokens, "--out", str(out), "--json"]
    if cli_has_precision():
        method = "entrain profile --precision bf16"
        cmd = [sys.executable, "-m", "entrain", "profile", "--device", "cuda", "--precision", "bf16", *common]
    else:
        method = (
            "entrain.runtime.profiler.profile_model under torch.autocast(cuda, bf16) (no --precision flag)"
        )
        cmd = [sys.executable, str(Path(__file__).resolve()), "--profile-worker", "cuda", *common]
    cmd += ["--warmup", "2", "--repeats", "5", "--budget-s", "1.0"]
    code, stdout, stderr = _run(cmd, budget_s)
    if code != 0:
        why = f"stopped after {budget_s:.0f} s" if code is None else f"exited {code}"
        return {"method": method, "status": why, "fits": [], "tail": stderr[-2000:]}
    return {"method": method, "status": "ok", "fits": json.loads(stdout)["fits"], "out": str(out)}


def profile_worker(device: str, argv: list[str]) -> int:
    """``--profile-worker DEVICE``: ``entrain profile``'s arguments, run under bf16 autocast on
    ``device``; the profile's notes then say ``"precision": "bf16"``."""
    import torch

    from entrain.cli.main import main as entrain

    with torch.autocast(device, dtype=torch.bfloat16):
        code = entrain(["profile", "--device", device, *argv])
    if code != 0:
        return code
    out = Path(argv[argv.index("--out") + 1])
    profile = json.loads(out.read_text())
    profile.setdefault("notes", {})["precision"] = "bf16"
    out.write_text(json.dumps(profile, indent=1))
    return 0


# --- 4. the report -----------------------------------------------------------------------------------
def _tests_section(tests: list[dict] | None) -> list[str]:
    lines = ["## `pytest -m gpu` (one file at a time, each with its own timeout)", ""]
    if tests is None:
        return [*lines, "Not run: the budget was spent.", ""]
    total = {k: sum(t.get(k, 0) for t in tests) for k in ("passed", "failed", "errors", "skipped")}
    lines.append(
        f"{total['passed']} passed, {total['failed']} failed, {total['errors']} errors, "
        f"{total['skipped']} skipped; {sum(t['status'] == 'timed out' for t in tests)} file(s) timed out, "
        f"{sum(t['status'] == 'not run' for t in tests)} not reached."
    )
    lines += [
        "",
        "| file | status | passed | failed | errors | skipped | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in tests:
        cells = [f"`{t['file']}`", t["status"], *(str(t.get(k, 0)) for k in total), f"{t['seconds']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [""] + [f"- not passed: `{name}`" for t in tests for name in t.get("not_passed", [])]
    return [*lines, ""]


def _p2p_section(p2p: dict | None) -> list[str]:
    lines = ["## Point-to-point path (two processes, NCCL, `Transport`)", ""]
    if p2p is None:
        return [*lines, "Not run: the budget was spent.", ""]
    if p2p["status"] == "refused":
        why = f"NCCL refuses two ranks on one GPU: `{p2p['why']}`; the two-GPU tests cover this path"
        return [*lines, f"Not run on this GPU: {why}.", ""]
    return [*lines, f"{p2p['status']} in {p2p['seconds']:.0f} s ({p2p['why']}).", ""]


def _profile_table(fits: list[dict]) -> list[str]:
    """Per measured layer and phase, its median ms at each size."""
    sizes = sorted({x for f in fits for x in f["tokens"]})
    head = ["component", "layer", "kind", "phase", *(f"{x}" for x in sizes)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in fits:
        ms = dict(zip(f["tokens"], f["ms"]))
        cells = [
            f["component"],
            f["layer"],
            f["kind"],
            f["phase"],
            *(f"{ms[x]:.3f}" if x in ms else "" for x in sizes),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _profiles_section(profiles: dict[str, dict | None]) -> list[str]:
    lines = ["## bf16 layer profiles (random weights, one layer per kind)", ""]
    for model, p in profiles.items():
        lines.append(f"### {model}")
        lines.append("")
        if p is None:
            lines += ["Not run: the budget was spent.", ""]
            continue
        if p["status"] != "ok":
            last = [x for x in p.get("tail", "").splitlines() if x.strip()][-1:]
            lines += [f"Not measured: {p['status']} ({p['method']}){': ' + last[0] if last else ''}.", ""]
            continue
        lines += [f"Measured with {p['method']}; profile `{Path(p['out']).name}` (for `--profile`).", ""]
        lines += [
            "Median forward / backward ms per layer at each size: patches per image (encoder), tokens "
            "per sample (LLM; labelled tokens for the layers that run at label positions only).",
            "",
        ]
        lines += [*_profile_table(p["fits"]), ""]
    return lines


def render_report(measured: dict) -> str:
    """``gpu_check.md`` from what the script measured: ``device`` (``device_info``), ``budget_s``,
    ``seconds``, ``p2p`` (``run_p2p``), ``tests`` (``run_gpu_tests``, None when not run) and
    ``profiles`` (model -> ``profile_bf16``'s result, None when not run); ``verdict`` first."""
    dev = measured["device"]
    lines = [
        "# GPU check (`python benchmarks/gpu_check.py`)",
        "",
        f"Device: {dev['device']} ({dev['num_gpus']} visible); torch {dev['torch']}, CUDA {dev['cuda']}. "
        f"Took {measured['seconds']:.0f} s of a {measured['budget_s']:.0f} s budget.",
        "",
        _verdict_line(measured),
        "",
    ]
    lines += _p2p_section(measured.get("p2p"))
    lines += _tests_section(measured["tests"])
    lines += _profiles_section(measured["profiles"])
    return "\n".join(lines).rstrip() + "\n"


# --- driver ------------------------------------------------------------------------------------------
def failures(measured: dict) -> list[str]:
    """Why the check does not pass (empty: every part ran and passed)."""
    out = []
    p2p = measured.get("p2p")
    if p2p is None or p2p["status"] not in ("passed", "refused"):
        out.append(f"point-to-point: {'not run' if p2p is None else p2p['status']}")
    tests = measured["tests"]
    if tests is None:
        out.append("gpu tests: not run")
    else:
        out += [f"{t['file']}: {t['status']}" for t in tests if t["status"] not in ("passed",)]
    for model, p in measured["profiles"].items():
        if p is None or p["status"] != "ok":
            out.append(f"profile {model}: {'not run' if p is None else p['status']}")
    return out


def verdict(measured: dict) -> int:
    """The exit status: 0 when ``failures`` is empty, else 1."""
    return 1 if failures(measured) else 0


def _verdict_line(measured: dict) -> str:
    bad = failures(measured)
    return "**Verdict: pass** (exit 0)." if not bad else f"**Verdict: FAIL** (exit 1): {'; '.join(bad)}."


def measure(out_dir: Path, budget_s: float, models: list[str], tokens: str, file_timeout_s: float) -> dict:
    t0 = time.monotonic()

    def left_s() -> float:
        return budget_s - (time.monotonic() - t0)

    measured = {"device": device_info(), "budget_s": budget_s, "p2p": None, "tests": None, "profiles": {}}
    if left_s() >= MIN_PART_S:
        measured["p2p"] = run_p2p(min(left_s(), P2P_TIMEOUT_S))
    if left_s() >= MIN_PART_S:
        measured["tests"] = run_gpu_tests(min(left_s(), TESTS_SHARE * budget_s), file_timeout_s)
    for i, model in enumerate(models):
        share_s = left_s() / (len(models) - i)
        if share_s < MIN_PART_S:
            measured["profiles"][model] = None
            continue
        measured["profiles"][model] = profile_bf16(
            model, out_dir / f"gpu_profile_{model}.json", tokens, share_s
        )
    measured["seconds"] = time.monotonic() - t0
    return measured


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--profile-worker"]:
        return profile_worker(argv[1], argv[2:])
    if argv[:1] == ["--p2p-worker"]:
        return p2p_worker(int(argv[1]), argv[2], argv[3])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=str(RESULTS), help="folder of gpu_check.md and the profiles")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="wall seconds for everything")
    ap.add_argument(
        "--file-timeout-s", type=float, default=FILE_TIMEOUT_S, help="longest run of one test file"
    )
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tokens", default=TOKENS, help="sizes to profile (entrain profile --tokens)")
    args = ap.parse_args(argv)
    reason = no_cuda_line()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    models = [m for m in args.models.split(",") if m]
    measured = measure(out_dir, args.budget_s, models, args.tokens, args.file_timeout_s)
    (out_dir / REPORT).write_text(render_report(measured))
    (out_dir / "gpu_check.json").write_text(json.dumps(measured, indent=1))
    code = verdict(measured)
    print(
        f"gpu_check: wrote {out_dir / REPORT} in {measured['seconds']:.0f} s; {_verdict_line(measured)}",
        file=sys.stderr,
    )
    return code


if __name__ == "__main__":
    raise SystemExit(main())
