"""A plan that chose expert parallelism trains as planned: ``entrain plan --ep 2`` on the tiny
Qwen3-VL-MoE checkpoint writes ``ep`` 2 in its layout, and ``entrain train --plan`` on its four ranks
(two replicas of encoder | LLM) runs with the experts sharded over the two replicas, for 1F1B and
for Entrain's own schedule (one LLM program per EP group, ``schedules.entrain``): config.json records
``ep`` 2 and each sparse layer's routing statistics are one EP group's (ranks of both replicas)."""

from __future__ import annotations

import json

import pytest

from tests.models.qwen3_vl_moe_tiny import save_whole

from .cases import SEED
from .cli_ranks import run_ranks


@pytest.mark.parametrize("system", ["1f1b", "entrain"])
def test_train_plan_runs_the_plans_ep(tmp_path, capsys, system):
    from entrain.cli.main import main

    folder = save_whole(tmp_path / "tiny")
    plan = tmp_path / "plan.json"
    common = ["--model-path", str(folder), "--dataset", "skewed", "--hardware", "cpu-tiny", "--global-batch", "4",
              "--microbatch-size", "1", "--seed", str(SEED)]  # fmt: skip
    argv = ["plan", *common, "--gpus", "4", "--dp", "2", "--ep", "2", "--system", system, "--iterations", "1",
            "--out", str(plan)]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    assert json.loads(plan.read_text())["layout"]["components"]["llm"]["ep"] == 2
    out = tmp_path / "run"
    argv = ["train", *common, "--plan", str(plan), "--steps", "1", "--out", str(out), "--no-progress"]
    results = run_ranks(argv, 4, tmp_path / "ranks", timeout_s=90)
    assert [r.exitcode for r in results] == [0] * 4, "".join(r.stderr[-2000:] for r in results)
    config = json.loads((out / "config.json").read_text())
    assert config["spec"]["ep"] == 2
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    entries = row["expert_tokens"]
    assert entries and all(len(e["ranks"]) == 2 for e in entries)  # one EP group of both replicas' LLM ranks
