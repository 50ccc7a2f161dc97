"""``train --replan auto --replan-degrees``: the drift monitor re-plans after a step onto another
microbatch size, checkpoints, and the worker group continues on the new plan and its degrees (what
``entrain train --nproc``'s launcher restarts it with, ``relaunch_args``) with the losses of a run started
on that plan from that checkpoint. Forked gloo ranks, no torchrun."""

from __future__ import annotations

import json
import shutil

import pytest

from entrain.cli import train as cli_train
from entrain.cli.main import build_parser
from entrain.cli.train_args import child_argv, relaunch_args
from entrain.core.errors import ConfigError
from entrain.runtime import checkpoint as ck
from entrain.runtime.replan import REPLAN_EXIT, read_state
from entrain.sim import adaptive

from .cli_ranks import run_ranks

BASE = ["train", "--model", "tiny", "--dataset", "curriculum", "--system", "entrain", "--global-batch", "8",
        "--microbatch-size", "1", "--steps", "4", "--max-pixels", "100352", "--no-progress"]  # fmt: skip
REPLAN = ["--replan", "auto", "--replan-window", "2", "--replan-restart-s", "0", "--replan-threshold", "-100",
          "--replan-degrees"]  # fmt: skip
"""Window 2: the first window (steps 0-1, chartqa) drifts from the whole mix and re-plans (the threshold
forces it); after the restart a full window again is steps 2-3, with no step left: one re-plan."""
WORLD = 4
NEW_MICROBATCH_SIZE = 2


def _other_degrees_only(monkeypatch) -> None:
    """The re-plan's choice forced onto other degrees (the choice itself: tests/sim/test_replan_degrees.py):
    the other-degree candidates at TP 1 and microbatch size 2 only, and of the monitor's finalists only the
    other-degree one (the forked ranks inherit the patches)."""
    real = adaptive.degrees_replanner
    monkeypatch.setattr(adaptive, "DEGREE_TPS", (1,))
    monkeypatch.setattr(adaptive, "DEGREE_MICROBATCH_SIZES", (NEW_MICROBATCH_SIZE,))
    monkeypatch.setattr(adaptive, "degrees_replanner", lambda *a: lambda batches: real(*a)(batches)[1:])


def _without_microbatch_size(argv: list[str]) -> list[str]:
    i = argv.index("--microbatch-size")
    return argv[:i] + argv[i + 2 :]


def _rows(out) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def replanned(tmp_path_factory):
    """The run up to the re-plan: every rank leaves with REPLAN_EXIT after the step-2 checkpoint."""
    out = tmp_path_factory.mktemp("replan") / "run"
    with pytest.MonkeyPatch.context() as monkeypatch:
        _other_degrees_only(monkeypatch)
        results = run_ranks([*BASE, *REPLAN, "--out", str(out)], WORLD, out.parent / "ranks", timeout_s=300)
    assert [r.exitcode for r in results] == [REPLAN_EXIT] * WORLD, results[0].stderr[-3000:]
    shutil.copytree(out, out.parent / "pristine")  # as the re-plan left it (a test below continues it)
    return out


def test_the_re_plan_is_logged_and_checkpointed(replanned):
    rows = _rows(replanned)
    assert [r["step"] for r in rows] == [0, 1]
    assert "replan" not in rows[0]
    record = rows[1]["replan"]
    assert record["iteration"] == 1 and set(record) == {
        "iteration",
        "old_allocation",
        "new_allocation",
        "predicted_gain",
        "old_microbatch_size",
        "new_microbatch_size",
        "changed",
    }
    assert (record["old_microbatch_size"], record["new_microbatch_size"]) == (1, NEW_MICROBATCH_SIZE)
    assert "microbatch_size" in record["changed"]
    assert ck.latest_manifest(replanned)["step"] == 2
    state = read_state(str(replanned))
    assert state["step"] == 2 and state["replans"] == [record]
    plan = json.loads(open(state["plan"]).read())
    assert plan["system"] == "entrain" and plan["layout"]["dp"] == record["new_allocation"]["dp"]
    assert plan["microbatch_size"] == NEW_MICROBATCH_SIZE
    tp = plan["layout"]["components"]["llm"]["tp"]
    pipeline_ranks = 1 + max(s["pp_rank"] for s in plan["layout"]["stages"])
    assert plan["layout"]["dp"] * pipeline_ranks * tp == WORLD  # the same processes


def test_the_group_continues_on_the_new_plan_as_a_run_started_from_the_checkpoint(replanned, tmp_path):
    reference = tmp_path / "reference"
    shutil.copytree(replanned, reference)
    state = read_state(str(replanned))
    # what the launcher restarts the group with
    args = build_parser().parse_args([*BASE, *REPLAN, "--out", str(replanned)])
    spec = cli_train._spec(args)
    again = ["train", *child_argv(relaunch_args(args, spec))]
    assert "--resume" in again and state["plan"] in again
    assert "--microbatch-size" not in again  # the plan's (the train default 2), not the flags' 1
    results = run_ranks(again, WORLD, tmp_path / "ranks", timeout_s=300)
    assert [r.exitcode for r in results] == [0] * WORLD, results[0].stderr[-3000:]
    assert "mb 1 -> E.PP" in results[0].stdout and f"mb {NEW_MICROBATCH_SIZE})" in results[0].stdout
    assert "replans=1 (after step 1:" in results[0].stdout
    # a run started on that plan from that checkpoint, without the monitor
    start = [*_without_microbatch_size(BASE), "--out", str(reference), "--resume", "--plan", state["plan"]]
    results = run_ranks(start, WORLD, tmp_path / "ranks2", timeout_s=300)
    assert [r.exitcode for r in results] == [0] * WORLD, results[0].stderr[-3000:]
    got, want = _rows(replanned), _rows(reference)
    assert [r["step"] for r in got] == [0, 1, 2, 3] and got[1]["replan"] == want[1]["replan"]
    for a, b in zip(got[2:], want[2:]):
        assert a["loss"] == b["loss"] and a["sample_ids"] == b["sample_ids"]
    config = json.loads((replanned / "config.json").read_text())
    assert config["layout"] == json.loads(open(state["plan"]).read())["layout"]
    assert config["layout"]["microbatch_size"] == NEW_MICROBATCH_SIZE


def test_the_resume_fingerprint_takes_the_re_plans_microbatch_size_and_no_other(replanned, tmp_path):
    """On the re-plan's checkpoint (written at microbatch size 1) a resume at the re-plan's microbatch size
    passes the fingerprint, another is refused; ``--resume`` with a ``--microbatch-size`` neither the run's
    nor the re-plan's is refused before any process starts."""
    out = replanned.parent / "pristine"
    saved = ck.latest_manifest(out)["fingerprint"]
    assert saved["microbatch_size"] == 1
    ck.check_resumable(out, {**saved, "microbatch_size": NEW_MICROBATCH_SIZE})
    with pytest.raises(ConfigError, match="microbatch_size: 1 -> 4"):
        ck.check_resumable(out, {**saved, "microbatch_size": 4})
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    argv = [*_without_microbatch_size(BASE), "--microbatch-size", "4", *REPLAN, "--out", str(copy)]
    refused = "started with --microbatch-size 1 and re-planned to --microbatch-size 2"
    with pytest.raises(ConfigError, match=refused):
        cli_train._spec(build_parser().parse_args([*argv, "--resume"]))


def test_a_resume_with_the_original_flags_continues_on_the_re_planned_layout(replanned, tmp_path):
    """The group stopped after the re-plan's checkpoint (no launcher restarted it): ``--resume`` with
    the flags the run was started with deploys the re-plan's layout, not the planner's first one, and
    the monitor, restored from state.json, watches that split."""
    out = tmp_path / "run"
    shutil.copytree(replanned.parent / "pristine", out)
    state = read_state(str(out))
    plan = json.loads(open(state["plan"].replace(str(replanned), str(out))).read())
    first = json.loads((out / "config.json").read_text())["layout"]
    assert plan["layout"] != first  # the re-plan moved the split
    results = run_ranks(
        [*BASE, *REPLAN, "--out", str(out), "--resume"], WORLD, tmp_path / "ranks", timeout_s=300
    )
    assert [r.exitcode for r in results] == [0] * WORLD, results[0].stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["layout"] == plan["layout"] and config["resumed_from_step"] == 2
    assert "continues on the run's last layout" in results[0].stderr
    assert "replans=1 (after step 1:" in results[0].stdout  # the restored monitor: no re-plan back
    assert [r["step"] for r in _rows(out)] == [0, 1, 2, 3]


def test_a_re_plan_onto_other_processes_is_refused():
    """The group restarts on the same processes: a re-plan whose DP x pipeline ranks x TP is another count
    is an error, not a restart that cannot start."""
    from types import SimpleNamespace

    from entrain.core.errors import EntrainError
    from entrain.runtime.replan import StepMonitor

    def setup(dp, ranks, tp):
        comp = SimpleNamespace(tp=tp)
        return SimpleNamespace(layout=SimpleNamespace(dp=dp, ranks_per_replica=ranks, world_size=dp * ranks,
                                                      components={"encoder": comp, "llm": comp}))  # fmt: skip

    class Monitor:
        def __init__(self, new):
            self.setup, self.new, self.replans = setup(2, 2, 1), new, [SimpleNamespace(to_json=dict)]

        def observe(self, step, batch):
            return self.new

    assert StepMonitor(None, "entrain", "", Monitor(setup(1, 2, 2))).observe(1, []) == {}  # 4 processes
    with pytest.raises(EntrainError, match="dp 1 x 2 pipeline ranks x tp 1 = 2 processes, but the run has 4"):
        StepMonitor(None, "entrain", "", Monitor(setup(1, 2, 1))).observe(1, [])
