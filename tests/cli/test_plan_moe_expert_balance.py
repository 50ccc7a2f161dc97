"""``entrain plan --json`` with expert parallelism lists the ``expert_balance`` decision (each EP
group's heavy deferral pairs run at one position, or Algorithm 3's order) after ``sub_microbatches``,
both candidates simulated (they differ: each replica runs 3 pairs), then ``expert_assignment`` (the
assignment weighing each sample's predicted busiest-expert time, or not: taken only past the margin), valid against entrain/schemas/plan.json; the plan it writes records the
option when it is taken."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema

from entrain.cli.main import main
from entrain.core.planning.extensions import DECISIONS, EP_DECISIONS, EP_GROUP

LAYOUT = ["--entrain-layout", "shared"]
"""The layout the default's ``layout`` decision takes on this request, given: every later decision is
made on that layout with the same candidate times, without the layout candidates' simulations on the
deployed memory check (3/4 of the command's time). The decision itself: tests/sim/test_close_calls.py."""


def test_plan_lists_the_expert_balance_decision(capsys):
    argv = ["plan", "--dataset", "chartqa", "--model", "qwen3vl-30b-a3b", "--gpus", "64", "--dp", "8",
            "--global-batch", "48", "--microbatch-size", "1", "--iterations", "1", "--jobs", "1", "--json",
            *LAYOUT]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, json.loads(resources.files("entrain").joinpath("schemas/plan.json").read_text()))
    assert out["layout"]["components"]["llm"]["ep"] > 1
    names = [d["name"] for d in out["decisions"]]
    assert "expert_balance" in names
    assert names.index("expert_balance") == names.index("sub_microbatches") + 1
    assert names.index("expert_assignment") == names.index("expert_balance") + 1
    assert [n for n in names if n not in EP_DECISIONS] == [n for n in DECISIONS if n in names]
    (d,) = [d for d in out["decisions"] if d["name"] == "expert_balance"]
    assert set(d["candidates"]) == {"off", "on"} and d["chosen"] in ("off", "on")
    assert d["candidates"]["on"] != d["candidates"]["off"]  # 6 microbatches a replica: the order moves
    (x,) = [d for d in out["decisions"] if d["name"] == "expert_assignment"]  # busiest-expert time weighed
    assert set(x["candidates"]) == {"off", "on", EP_GROUP} and x["default"] == "off"
    ms = x["candidates"]
    on = x["chosen"] != "off"
    assert on == (min(ms["on"], ms[EP_GROUP]) < ms["off"] * (1 - x["margin"]))
    assert out["schedule_options"].get("expert_assignment", False) is on
    assert out["schedule_options"].get("expert_group_bins", False) is (x["chosen"] == EP_GROUP)
