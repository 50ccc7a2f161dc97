"""Issue 26, requirement 7: what a machine with a GPU checks, in one script, within a time budget.

1. ``pytest -m gpu`` (the CUDA tests: exact gradients against the CPU float64 reference, bf16
   training, CUDA-event timing, peak memory, real-size layers; multi-GPU ones skip on one GPU):
   pass / fail / skip counts from its JUnit XML.
2. ``entrain profile`` of real-size ``qwen25vl-llama3-1b`` and ``qwen25vl-llama3-3b`` layers (one
   layer per kind, random weights) in bf16 on ``cuda``: profile JSONs usable with ``--profile``
   (``gpu_profile_MODEL.json``). ``profile_bf16`` alone decides how (``entrain profile --precision
   bf16`` where the CLI has the flag; else the profiler under bf16 autocast in a child process).
3. ``gpu_check.md``: the device, torch and CUDA versions, the test counts and the per-layer times
   at each size measured, only what was measured (a part the budget did not reach says so).

Each part has its share of ``--budget-s`` (default 480 s: 8 minutes) and is stopped when it runs
past it. Without CUDA the script prints one line and exits with status 2, writing nothing.

    python benchmarks/gpu_check.py [--out-dir benchmarks/results] [--budget-s 480]
        [--models qwen25vl-llama3-1b,qwen25vl-llama3-3b] [--tokens 256,1024,4096,8192]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
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
TESTS_SHARE = 0.5
"""Share of the budget for ``pytest -m gpu``; the profiles split what is left."""
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


def _run(cmd: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    """(exit status, or None when stopped at ``timeout_s``; stdout; stderr). The command runs in its
    own process group, killed whole at the deadline (pytest's spawned GPU workers included)."""
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err
    return proc.returncode, out, err


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


def run_gpu_tests(budget_s: float) -> dict:
    """``pytest -m gpu tests`` stopped after ``budget_s``: counts and the time it took."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            "gpu",
            "tests",
            f"--junitxml={xml}",
            "-p",
            "no:cacheprovider",
        ]
        t0 = time.monotonic()
        code, out, err = _run(cmd, budget_s)
        seconds = time.monotonic() - t0
        if code is None or not xml.exists():
            why = (
                f"stopped after {budget_s:.0f} s"
                if code is None
                else f"pytest exited {code} without a report"
            )
            return {"status": why, "seconds": seconds, "tail": (out + err)[-2000:]}
        counts = junit_counts(xml.read_text())
    return {"status": f"pytest exited {code}", "seconds": seconds, **counts, "tail": (out + err)[-2000:]}


# --- 2. the bf16 profiles ----------------------------------------------------------------------------
@functools.cache
def cli_has_precision() -> bool:
    """Whether ``entrain profile`` takes ``--precision`` (issue 26, requirement 4)."""
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


# --- 3. the report -----------------------------------------------------------------------------------
def _tests_section(tests: dict | None) -> list[str]:
    lines = ["## `pytest -m gpu`", ""]
    if tests is None:
        return [*lines, "Not run: the budget was spent.", ""]
    if "passed" not in tests:
        return [*lines, f"No counts: {tests['status']} ({tests['seconds']:.0f} s).", ""]
    lines.append(
        f"{tests['passed']} passed, {tests['failed']} failed, {tests['errors']} errors, "
        f"{tests['skipped']} skipped in {tests['seconds']:.0f} s ({tests['status']})."
    )
    lines += [f"- not passed: `{name}`" for name in tests["not_passed"]]
    return [*lines, ""]


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
    ``seconds``, ``tests`` (``run_gpu_tests``, None when not run) and ``profiles`` (model ->
    ``profile_bf16``'s result, None when not run)."""
    dev = measured["device"]
    lines = [
        "# GPU check (`python benchmarks/gpu_check.py`)",
        "",
        f"Device: {dev['device']} ({dev['num_gpus']} visible); torch {dev['torch']}, CUDA {dev['cuda']}. "
        f"Took {measured['seconds']:.0f} s of a {measured['budget_s']:.0f} s budget.",
        "",
    ]
    lines += _tests_section(measured["tests"])
    lines += _profiles_section(measured["profiles"])
    return "\n".join(lines).rstrip() + "\n"


# --- driver ------------------------------------------------------------------------------------------
def measure(out_dir: Path, budget_s: float, models: list[str], tokens: str) -> dict:
    t0 = time.monotonic()

    def left_s() -> float:
        return budget_s - (time.monotonic() - t0)

    measured = {"device": device_info(), "budget_s": budget_s, "tests": None, "profiles": {}}
    if left_s() >= MIN_PART_S:
        measured["tests"] = run_gpu_tests(min(left_s(), TESTS_SHARE * budget_s))
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=str(RESULTS), help="folder of gpu_check.md and the profiles")
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall seconds for everything")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tokens", default=TOKENS, help="sizes to profile (entrain profile --tokens)")
    args = ap.parse_args(argv)
    reason = no_cuda_line()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    measured = measure(out_dir, args.budget_s, [m for m in args.models.split(",") if m], args.tokens)
    (out_dir / REPORT).write_text(render_report(measured))
    (out_dir / "gpu_check.json").write_text(json.dumps(measured, indent=1))
    print(f"gpu_check: wrote {out_dir / REPORT} in {measured['seconds']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
