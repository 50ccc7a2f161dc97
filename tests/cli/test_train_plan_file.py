"""``entrain train --plan FILE``: a tampered plan file is one line naming the file and the
field before any process starts; the plan's model, dataset, pixel limits and batch sizes apply, and a
flag given beside it that contradicts them is one line (no torchrun launch in this file)."""

from __future__ import annotations

import copy
import json

import pytest

from entrain.cli import train as train_cli
from entrain.cli.main import main
from entrain.core.errors import ConfigError
from entrain.core.planning.setups import read_plan_file

TINY_COUNTS = {"encoder": 4, "llm": 6}  # patch_embed, 2 blocks, merger; embed, 2 layers, norm, head, loss


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("plan") / "p.json"
    argv = ["plan", "--model", "tiny", "--dataset", "skewed", "--gpus", "3", "--global-batch", "6",
            "--microbatch-size", "1", "--max-pixels", "50000", "--system", "1f1b", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    d = json.loads(out.read_text())
    # a hand layout: encoder [0, 4) on rank 0, LLM [0, 3) on rank 1 and [3, 6) on rank 2
    d["layout"]["components"]["encoder"]["pp"], d["layout"]["components"]["llm"]["pp"] = 1, 2
    d["layout"]["stages"] = [
        {"stage": 0, "component": "encoder", "layers": [0, 4], "pp_rank": 0},
        {"stage": 1, "component": "llm", "layers": [0, 3], "pp_rank": 1},
        {"stage": 2, "component": "llm", "layers": [3, 6], "pp_rank": 2},
    ]
    return d


@pytest.fixture
def launched(monkeypatch) -> list:
    """The specs ``train`` would have launched torchrun with (none is started)."""
    specs = []
    monkeypatch.setattr(train_cli, "_launch", lambda args, spec, nproc: specs.append(spec) or 0)
    return specs


def _write(tmp_path, d: dict) -> str:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    return str(path)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_the_hand_layout_is_valid(tmp_path, plan):
    system, setup = read_plan_file(_write(tmp_path, plan), expect_model="tiny", layer_counts=TINY_COUNTS)
    assert system == "1f1b" and setup.layout.world_size == 3


def _stage(i, key, value):
    def edit(d):
        d["layout"]["stages"][i][key] = value

    return edit


def _drop(*keys):
    def edit(d):
        target = d
        for k in keys[:-1]:
            target = target[k]
        del target[keys[-1]]

    return edit


def _both(first, second):
    return lambda d: (first(d), second(d))


def _top(key, value):
    def edit(d):
        d[key] = value

    return edit


TAMPERED = {
    "skipped layer": (_stage(1, "layers", [0, 2]),
                      "layout.stages[2].layers: [3, 6) after the llm's layers up to 2: layer(s) 2..2 skipped"),
    "overlap": (_stage(2, "layers", [2, 6]), "layout.stages[2].layers: [2, 6) after the llm's layers up to 3: layer(s) 2..2 run twice"),
    "wrong type": (lambda d: d["layout"]["stages"][2]["layers"].__setitem__(1, "6"),
                   "layout.stages[2].layers[1]: expected int, got str"),
    "bool for int": (_top("global_batch", True), "global_batch: expected int, got bool"),
    "missing field": (_drop("layout", "stages", 1, "pp_rank"), "layout.stages[1].pp_rank: missing"),
    "missing top field": (_drop("max_pixels"), "max_pixels: missing"),
    "missing component": (_drop("layout", "components", "llm"), "layout.components.llm: missing"),
    "bad pp_rank gap": (_stage(2, "pp_rank", 3), "pipeline ranks [0, 1, 3] leave a rank without a stage"),
    "negative pp_rank": (_stage(0, "pp_rank", -1), "layout.stages[0].pp_rank: expected an int >= 0, got -1"),
    "pp_rank backwards": (_both(_stage(2, "pp_rank", 0), _stage(0, "pp_rank", 2)),
                          "layout.stages[2].pp_rank: 0: the llm's stages must be on non-decreasing pipeline ranks"),
    "out of range": (_stage(2, "layers", [3, 7]), "layout.stages[2].layers: [3, 7) ends past the model's 6 llm layers"),
    "short": (_stage(2, "layers", [3, 5]), "the llm's stages end at layer 5, but the model has 6 llm layers"),
    "empty": (_stage(2, "layers", [3, 3]), "layout.stages[2].layers: [3, 3) is empty"),
    "stage number": (_stage(1, "stage", 2), "layout.stages[1].stage: expected 1"),
    "component name": (_stage(1, "component", "vit"), "layout.stages[1].component: expected 'encoder' or 'llm'"),
    "pp count": (lambda d: d["layout"]["components"]["llm"].update(pp=3), "layout.components.llm.pp: 3, but the layout puts the llm on 2 pipeline rank(s)"),
    "stages not a list": (lambda d: d["layout"].update(stages={}), "layout.stages: expected a non-empty list, got object"),
    "three layer bounds": (_stage(0, "layers", [0, 2, 4]), "layout.stages[0].layers: expected a list of 2, got 3 item(s)"),
    "unknown option": (_top("schedule_options", {"ramp": 2}), "schedule_options.ramp: unknown schedule option"),
    "option type": (_top("schedule_options", {"split_weight_grads": "yes"}), "schedule_options.split_weight_grads: expected bool, got str"),
    # every level refuses a field entrain plan does not write, by its JSON path
    "unknown top field": (_top("min_pixel", 3136), "min_pixel: unknown field (did you mean 'min_pixels'?)"),
    "misspelt options": (lambda d: d.update(schedul_options=d.pop("schedule_options")),
                         "schedul_options: unknown field (did you mean 'schedule_options'?)"),
    "unknown stage field": (_stage(1, "extra", 1), "layout.stages[1].extra: unknown field"),
    "unknown layout field": (lambda d: d["layout"].update(pp=2), "layout.pp: unknown field"),
    "unknown component": (lambda d: d["layout"]["components"].update(vit={"tp": 1, "cp": 1, "pp": 1}),
                          "layout.components.vit: unknown field"),
    "unknown degree": (lambda d: d["layout"]["components"]["llm"].update(sp=1),
                       "layout.components.llm.sp: unknown field"),
    "ep below 1": (lambda d: d["layout"]["components"]["llm"].update(ep=0),
                   "layout.components.llm.ep"),
    "unknown model source": (_top("model_source", {"model_dir": "/x"}),
                             "model_source.model_dir: unknown field (did you mean 'model_path'?)"),
    "unknown fingerprint": (_top("checkpoint_fingerprint", {"weights": "ab"}),
                            "checkpoint_fingerprint.weights: unknown field"),
    "unknown trial field": (lambda d: d["trials"][0].update(size=4), "trials[0].size: unknown field"),
    "unknown config field": (lambda d: d["config"]["components"]["encoder"].update(tpp=1),
                             "config.components.encoder.tpp: unknown field (did you mean 'tp'?)"),
    "unknown decision field": (lambda d: d["decisions"].append({"nam": "x"}), "].nam: unknown field (did you mean 'name'?)"),
    "nearly empty": (lambda d: d.clear() or d.update(x=1), "x: unknown field"),
    "only report fields": (lambda d: d.clear() or d.update(b_min=1), "system: missing"),
}  # fmt: skip


@pytest.mark.parametrize("case", TAMPERED)
def test_a_tampered_plan_is_one_line_before_launch(tmp_path, capsys, plan, launched, case):
    edit, expected = TAMPERED[case]
    d = copy.deepcopy(plan)
    edit(d)
    path = _write(tmp_path, d)
    assert main(["train", "--plan", path, "--out", str(tmp_path / "run")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"entrain train: error: --plan {path}: ") and expected in line, line
    assert launched == [] and not (tmp_path / "run").exists()


def test_the_plans_run_fields_apply(tmp_path, capsys, plan, launched):
    """A plan made with --max-pixels 50000 trains with it; its dataset and batch sizes apply too."""
    d = copy.deepcopy(plan)
    d["dataset"] = "cocoqa"
    assert main(["train", "--plan", _write(tmp_path, d), "--out", str(tmp_path / "run")]) == 0
    (spec,) = launched
    assert (spec.data.max_pixels, spec.data.dataset, spec.model.name) == (50000, "cocoqa", "tiny")
    assert (spec.parallel.global_batch, spec.parallel.microbatch_size) == (6, 1)
    assert spec.run.flags["max_pixels"] == 50000  # config.json replays the plan's values


CONTRADICTING = {
    "--global-batch": ["--global-batch", "16"],  # the default: given all the same
    "--microbatch-size": ["--microbatch-size=2"],
    "--system": ["--system", "entrain"],
    "--max-pixels": ["--max-pixels", "60000"],
    "--min-pixels": ["--min-pixels", "4096"],
    "--dp": ["--dp", "2"],
    "--llm-stages": ["--llm-stages", "1"],
}


@pytest.mark.parametrize("flag", CONTRADICTING)
def test_a_flag_contradicting_the_plan_is_one_line(tmp_path, capsys, plan, launched, flag):
    path = _write(tmp_path, plan)
    assert main(["train", "--plan", path, *CONTRADICTING[flag], "--out", str(tmp_path / "run")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"--plan {path} was made with {flag} " in line and f"drop {flag}" in line, line
    assert launched == []


def test_agreeing_flags_are_accepted(tmp_path, plan, launched):
    argv = [
        "--global-batch",
        "6",
        "--micro",
        "1",
        "--system",
        "1f1b",
        "--max-pixels",
        "50000",
        "--dataset",
        "skewed",
    ]
    assert main(["train", "--plan", _write(tmp_path, plan), *argv, "--out", str(tmp_path / "run")]) == 0
    assert len(launched) == 1


def test_another_model_is_one_line(tmp_path, capsys, plan, launched):
    assert main(["train", "--plan", _write(tmp_path, plan), "--model", "qwen25vl-llama3-1b"]) == 2
    assert "is for model 'tiny' but this run's model is 'qwen25vl-llama3-1b'" in _one_line(
        capsys.readouterr().err
    )


def test_another_dataset_needs_allow_other_dataset(tmp_path, capsys, plan, launched):
    path = _write(tmp_path, plan)
    argv = ["train", "--plan", path, "--dataset", "cocoqa", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert "was made for dataset 'skewed', but --dataset 'cocoqa'" in line and "--allow-other-dataset" in line
    assert launched == []
    assert main([*argv, "--allow-other-dataset"]) == 0
    assert "note: running the plan made for dataset 'skewed' on 'cocoqa'" in capsys.readouterr().err
    assert launched[0].data.dataset == "cocoqa"


def test_a_dataset_path_spelled_otherwise_is_the_same(tmp_path, monkeypatch):
    from entrain.cli.plan_flags import same_dataset

    (tmp_path / "d.jsonl").write_text("")
    monkeypatch.chdir(tmp_path)
    assert same_dataset("d.jsonl", str(tmp_path / "d.jsonl")) and same_dataset("skewed", "skewed")
    assert not same_dataset("skewed", "cocoqa")


def test_a_plan_without_layer_counts_still_checks_coverage(tmp_path, plan):
    d = copy.deepcopy(plan)
    d["layout"]["stages"][2]["layers"] = [4, 6]
    with pytest.raises(ConfigError, match="layer\\(s\\) 3..3 skipped"):
        read_plan_file(_write(tmp_path, d))


def test_a_plan_made_with_model_path_trains_without_the_flag_again(tmp_path, launched):
    """``plan --model-path DIR --out P`` records the folder (``model_source``); ``train --plan P``
    alone then trains that checkpoint, and another ``--model`` is still refused."""
    from tests.models.qwen_vl_tiny import save_with_tokenizer

    ckpt = save_with_tokenizer(tmp_path / "ckpt", "qwen2_5_vl", text_layers=2, vision_depth=2, tied=True)
    path = tmp_path / "p.json"
    argv = ["plan", "--model-path", str(ckpt), "--dataset", "skewed", "--gpus", "2", "--global-batch", "4",
            "--microbatch-size", "1", "--max-pixels", "50000", "--system", "1f1b", "--out", str(path)]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(path.read_text())["model_source"] == {"model_path": str(ckpt.resolve())}
    assert main(["train", "--plan", str(path), "--out", str(tmp_path / "run")]) == 0
    (spec,) = launched
    assert spec.model.model_path == str(ckpt.resolve())
    assert spec.run.flags["model_path"] == str(ckpt.resolve())  # config.json replays it
    other = ["train", "--plan", str(path), "--model", "qwen25vl-llama3-1b", "--out", str(tmp_path / "r2")]
    assert main(other) == 2


def test_every_field_of_the_plan_schema_is_known_to_the_plan_file_check():
    """The strict check (unknown fields refused) knows every field ``entrain plan --json`` documents."""
    from pathlib import Path

    from entrain.core.planning.plan_file import PLAN_FIELDS, REPORT_FIELDS

    schema = json.loads((Path(__file__).parents[2] / "entrain" / "schemas" / "plan.json").read_text())
    assert set(schema["properties"]) <= set(PLAN_FIELDS) | set(REPORT_FIELDS)
    for field in ("model_source", "checkpoint_fingerprint"):
        assert set(schema["properties"][field]["properties"]) == set(REPORT_FIELDS[field].spec)
