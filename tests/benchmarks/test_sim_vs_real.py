"""benchmarks/sim_vs_real.py covers the LLM-dominant set (issue 10 req. 7): the same synth -> plan ->
train chain, with the pixel cap on every step and Entrain planned with the two-resource assignment."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def sim_vs_real(benchmarks_on_path):
    return importlib.import_module("sim_vs_real")


def _argv(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


@pytest.mark.parametrize("dataset", ["chartqa", "text-heavy"])
def test_each_step_gets_the_case_flags(sim_vs_real, monkeypatch, tmp_path, dataset):
    case = sim_vs_real.CASES[dataset]
    calls = []

    def fake(*argv, quiet=True):
        calls.append(list(argv))
        if "--out" in argv and argv[0] == "plan":
            Path(_argv(list(argv), "--out")).write_text(json.dumps({"system": _argv(list(argv), "--system")}))

    monkeypatch.setattr(sim_vs_real, "_entrain", fake)
    sim_vs_real.synth(str(tmp_path / "ds"), case)
    paths = {s: str(tmp_path / f"plan_{s}.json") for s in sim_vs_real.SYSTEMS}
    for s in sim_vs_real.SYSTEMS:
        sim_vs_real.plan("data.json", "prof.json", s, paths[s], case)
    sim_vs_real.train("data.json", "prof.json", paths, str(tmp_path / "run"), 2, case)
    synth, plans, trains = calls[0], calls[1:3], calls[3:]
    assert _argv(synth, "--dataset") == dataset
    assert _argv(synth, "--num-samples") == str(case.config["num_samples"])
    pixels = str(224 * 224) if dataset == "text-heavy" else None
    for cmd in plans + trains:
        assert _argv(cmd, "--max-pixels") == pixels
    assignment = {_argv(cmd, "--system"): _argv(cmd, "--assignment") for cmd in plans}
    want = "two-resource" if dataset == "text-heavy" else None
    assert assignment == {"entrain": want, "1f1b": None}
    assert [_argv(cmd, "--microbatch-size") for cmd in plans] == [str(case.config["microbatch_size"])] * 2
    assert case.results == ("sim_vs_real" if dataset == "chartqa" else "sim_vs_real_text_heavy")
