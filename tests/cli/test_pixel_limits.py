"""``--min-pixels`` / ``--max-pixels``: the same image-processor limits in
``data stats``, ``plan``, ``assign``, ``simulate`` and ``train``, so plans and training count the
same patches."""

from __future__ import annotations

import json

import pytest

from entrain.cli.main import build_parser, main
from entrain.cli.train import _spec
from entrain.core.workload.samples import smart_resize
from entrain.runtime.run_data import load_data

SMALL = 128 * 28 * 28  # at most 128 merged tokens an image


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_data_stats_follow_max_pixels(capsys):
    argv = ["data", "stats", "--dataset", "chartqa", "--num-samples", "200", "--model", "tiny", "--json"]
    full, small = _json(capsys, argv), _json(capsys, [*argv, "--max-pixels", str(SMALL)])
    assert small["image_tokens"]["p95"] <= 128 < full["image_tokens"]["p95"]
    big = _json(capsys, [*argv, "--min-pixels", str(4 * SMALL), "--max-pixels", str(8 * SMALL)])
    assert big["image_tokens"]["p5"] >= 4 * 128 * 0.9


@pytest.mark.parametrize("command", ["plan", "assign", "simulate"])
def test_planning_commands_take_the_limits(capsys, command):
    argv = [command, "--dataset", "chartqa", "--model", "tiny", "--gpus", "2", "--dp", "1", "--global-batch", "8",
            "--microbatch-size", "2", "--iterations", "1", "--json"]  # fmt: skip
    if command == "simulate":
        argv += ["--systems", "1f1b"]
    full, small = _json(capsys, argv), _json(capsys, [*argv, "--max-pixels", str(SMALL)])
    assert full != small  # the same samples cost less with smaller images


def test_train_samples_carry_the_limits(tmp_path):
    argv = ["train", "--model", "tiny", "--dataset", "chartqa", "--global-batch", "4", "--steps", "1",
            "--max-pixels", str(SMALL), "--out", str(tmp_path)]  # fmt: skip
    spec = _spec(build_parser().parse_args(argv))
    data = load_data(spec, spec.model.cost_model())
    metas = [w.meta for w in data.train[0]]
    assert all(m.vision.max_pixels == SMALL for m in metas)
    for m in metas:
        for h, w in m.images:
            rh, rw = smart_resize(h, w, m.vision)
            assert rh * rw <= SMALL


def test_bad_limits_are_one_line_errors(capsys):
    assert (
        main(["data", "stats", "--dataset", "chartqa", "--min-pixels", "5000", "--max-pixels", "4000"]) == 2
    )
    assert "--min-pixels 5000 / --max-pixels 4000" in capsys.readouterr().err
