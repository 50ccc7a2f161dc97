"""``entrain train`` of a tiny Qwen2.5-Omni thinker on 3 forked ranks, the planner choosing the layout:
Entrain plans one pipeline per encoder tower (``runtime.planning.encoders_setup``: the N-encoder
planner's profile and search, as ``entrain simulate`` does for such a model), a vision rank and an
audio rank feeding the LLM rank, and the run trains its steps on the ``omni`` draw (images, audio
clips, videos with their tracks) with every step's Plan in ``plan.json``."""

from __future__ import annotations

import json
import math

from entrain.core.ir.plan import Plan
from tests.models.qwen2_5_omni_tiny import save_whole

from .cli_ranks import run_ranks

STEPS = 2


def test_train_plans_one_pipeline_per_tower(tmp_path):
    folder = save_whole(tmp_path / "tiny", text_layers=2, vision_depth=2, audio_layers=1)
    out = tmp_path / "run"
    argv = ["train", "--model-path", str(folder), "--dataset", "omni", "--hardware", "cpu-tiny",
            "--global-batch", "4", "--microbatch-size", "1", "--steps", str(STEPS), "--out", str(out),
            "--no-progress"]  # fmt: skip
    results = run_ranks(argv, 3, tmp_path / "ranks", timeout_s=120)
    assert [r.exitcode for r in results] == [0, 0, 0], "".join(r.stderr[-3000:] for r in results)
    config = json.loads((out / "config.json").read_text())
    assert config["setup"].startswith("N-encoder planner (vision, audio)"), config["setup"]
    plan = Plan.from_json(json.loads((out / "plan.json").read_text()))
    assert plan.layout.encoder_names == ("vision", "audio")
    assert [len(g) for g in plan.layout.encoder_groups] == [1, 1] and plan.layout.world_size == 3
    assert len(plan.iterations) == STEPS
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 and r["grad_norm"] > 0 for r in rows)
