"""Costs in the training precision: ``entrain profile --precision`` times the layers under the autocast
training uses and records the precision; ``plan`` and ``train`` warn when a profile's precision is
not the run's."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch
from torch import nn

from entrain.cli.main import build_parser, main
from entrain.core.costs.costmodel import CostModel

PROFILE = [
    "profile",
    "--model",
    "tiny",
    "--device",
    "cpu",
    "--tokens",
    "8,16",
    "--repeats",
    "1",
    "--warmup",
    "0",
]


def _profile(out, *flags) -> tuple[dict, set[torch.dtype]]:
    """(--json output, dtypes of every Linear output) of a tiny profile on the CPU."""
    seen: set[torch.dtype] = set()

    def hook(module, args, output):
        if isinstance(module, nn.Linear):
            seen.add(output.dtype)

    handle = nn.modules.module.register_module_forward_hook(hook)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            assert main([*PROFILE, *flags, "--out", str(out), "--json"]) == 0
    finally:
        handle.remove()
    return json.loads(buf.getvalue()), seen


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """Tiny profiles in fp32 (the CPU default) and bf16: their paths, --json outputs and Linear dtypes."""
    folder = tmp_path_factory.mktemp("profiles")
    out = {}
    for precision, flags in (("fp32", ()), ("bf16", ("--precision", "bf16"))):
        path = folder / f"{precision}.json"
        out[precision] = (path, *_profile(path, *flags))
    return out


def test_profile_times_in_the_precision_it_records(profiles):
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        path, doc, linear_dtypes = profiles[precision]
        assert doc["precision"] == precision
        assert CostModel.load(str(path)).measured_precision() == (precision, True)
        assert linear_dtypes == {dtype}  # bf16: every forward under bf16 autocast, as training runs it


def _variant(tmp_path, source, name: str, **notes) -> str:
    """A copy of the profile at ``source`` with ``notes`` replaced (None: the key removed)."""
    doc = json.loads(source.read_text())
    for key, value in notes.items():
        if value is None:
            doc["notes"].pop(key, None)
        else:
            doc["notes"][key] = value
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


PLAN = ["plan", "--model", "tiny", "--dataset", "skewed", "--gpus", "4", "--global-batch", "8"]
PLAN += ["--microbatch-size", "2", "--iterations", "1", "--json"]


@pytest.mark.parametrize(
    "device, precision, warning",
    [
        ("cpu", "fp32", None),
        ("cuda:0", "bf16", None),
        (
            "cuda:0",
            "fp32",
            "measured in fp32 but entrain train on cuda (its default --precision) computes in bf16",
        ),
        (
            "cpu",
            "bf16",
            "measured in bf16 but entrain train on cpu (its default --precision) computes in fp32",
        ),
        ("cpu", None, None),  # an old profile: fp32, as the CPU default
        ("cuda", None, "records no precision (written before `entrain profile --precision`; taken as fp32)"),
    ],
)
def test_plan_warns_when_the_profile_precision_is_not_the_runs(
    profiles, tmp_path, capsys, device, precision, warning
):
    path = _variant(tmp_path, profiles["fp32"][0], "p.json", device=device, precision=precision)
    assert main([*PLAN, "--profile", path]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["model"] == "tiny"
    lines = [x for x in captured.err.splitlines() if "precision" in x]
    if warning is None:
        assert lines == []
    else:
        assert len(lines) == 1 and lines[0].startswith(f"entrain plan: warning: profile {path} ")
        assert warning in lines[0] and "entrain profile --precision" in lines[0]


TRAIN = ["train", "--model", "tiny", "--dataset", "skewed", "--global-batch", "2", "--microbatch-size", "1"]
TRAIN += ["--system", "dip", "--steps", "1", "--no-progress"]


def test_train_warns_when_the_profile_precision_is_not_the_runs(profiles, tmp_path, capsys):
    """A single-process CPU run (fp32 by default) planned from a bf16 profile says so on stderr."""
    path, _, _ = profiles["bf16"]
    assert main([*TRAIN, "--profile", str(path), "--out", str(tmp_path / "run")]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "precision" in x]
    assert len(lines) == 1 and lines[0].startswith("entrain train: warning: profile ")
    assert "measured in bf16 but this run on cpu (--precision default) computes in fp32" in lines[0]


@pytest.mark.parametrize(
    "flags, device, profile, warned",
    [
        ((), "cuda", "bf16", False),  # bf16 is the CUDA default
        ((), "cuda", "fp32", True),
        (("--precision", "fp32"), "cuda", "fp32", False),
        (("--precision", "bf16"), "cpu", "bf16", False),
        (("--precision", "bf16"), "cpu", "fp32", True),
        ((), "cpu", "fp32", False),
    ],
)
def test_train_compares_with_its_effective_precision(profiles, capsys, flags, device, profile, warned):
    from entrain.cli.train import _spec
    from entrain.cli.train_worker import _warn_profile_precision

    path, _, _ = profiles[profile]
    spec = _spec(build_parser().parse_args([*TRAIN, *flags, "--profile", str(path), "--out", "unused"]))
    line = _warn_profile_precision(spec, torch.device(device))
    assert (line is not None) == warned
    assert (capsys.readouterr().err.count("entrain train: warning:") == 1) == warned
