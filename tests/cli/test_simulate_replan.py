"""``entrain simulate --replan auto`` on the drifting ``curriculum``: the re-plans in ``--json``
(``systems.<name>.replans``, schema-checked) and the monitor's record per iteration."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema

from entrain.cli.main import build_parser, main
from entrain.config import RunConfig

TINY = ["simulate", "--model", "tiny", "--dataset", "curriculum", "--gpus", "4", "--global-batch", "16",
        "--microbatch-size", "2", "--iterations", "6", "--systems", "entrain,dip", "--json"]  # fmt: skip
AUTO = ["--replan", "auto", "--replan-window", "1", "--replan-restart-s", "0"]


def _schema() -> dict:
    return json.loads(resources.files("entrain").joinpath("schemas/simulate.json").read_text())


def test_replan_auto_re_plans_on_the_curriculum_and_logs_it(capsys):
    assert main([*TINY, *AUTO]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    jsonschema.validate(out, _schema())
    entrain, dip = out["systems"]["entrain"], out["systems"]["dip"]
    assert dip["replans"] == [] and "drift" not in dip  # baselines are not re-planned
    assert entrain["replans"], entrain["drift"]
    first = entrain["replans"][0]
    assert first["old_allocation"] != first["new_allocation"] and first["predicted_gain"] > 0.05
    # without --replan-degrees: the split (and DP, left open) moves, never TP or the microbatch size
    assert (
        first["old_microbatch_size"] == first["new_microbatch_size"] == 2
        and "microbatch_size" not in first["changed"]
    )
    assert first["changed"] and not {"tp", "cp"} & set(first["changed"])
    assert first["old_allocation"] == {"dp": entrain["config"]["dp"], "ranks_per_replica": entrain["config"]["ranks_per_replica"],
                                       **{c: entrain["config"]["components"][c] for c in ("encoder", "llm")}}  # fmt: skip
    assert [d["iteration"] for d in entrain["drift"]] == list(range(6))
    assert entrain["drift"][first["iteration"]]["predicted_gain"] == first["predicted_gain"]
    assert len(entrain["iteration_time_ms_per_iter"]) == 6
    assert "re-plan after iteration" in captured.err


def test_replan_off_keeps_one_plan(capsys):
    assert main(TINY) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, _schema())
    assert out["systems"]["entrain"]["replans"] == [] and "drift" not in out["systems"]["entrain"]


def test_replan_degrees_is_one_setting_of_simulate_and_train():
    """``--replan-degrees`` turns ``ReplanSettings.degrees`` on in both commands (off by default)."""
    parser = build_parser()
    for command in (TINY, ["train", "--model", "tiny", "--dataset", "curriculum"]):
        for extra, want in (([], False), (["--replan-degrees"], True)):
            args = parser.parse_args([*command, *AUTO, *extra])
            assert RunConfig.from_args(args).schedule.replan_settings().degrees is want, (command[0], extra)
