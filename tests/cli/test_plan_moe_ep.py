"""``entrain plan --json`` on a model with experts reports the expert parallelism it chose (the LLM's
``ep`` in ``config.components`` and in the ``layout`` that ``train --plan`` runs), valid against
entrain/schemas/plan.json; ``--ep`` on a dense model is refused by name."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema

from entrain.cli.main import main


def test_plan_json_reports_the_chosen_ep(capsys):
    argv = ["plan", "--dataset", "chartqa", "--model", "qwen3vl-30b-a3b", "--gpus", "64", "--dp", "8",
            "--global-batch", "16", "--microbatch-size", "1", "--iterations", "1", "--jobs", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, json.loads(resources.files("entrain").joinpath("schemas/plan.json").read_text()))
    llm = out["config"]["components"]["llm"]
    assert llm["ep"] > 1 and 8 % llm["ep"] == 0  # one replica cannot hold the 29 B expert parameters
    assert out["layout"]["components"]["llm"]["ep"] == llm["ep"]
    assert "ep" not in out["config"]["components"]["encoder"]
    assert out["fits_memory"]


def test_ep_on_a_dense_model_is_refused(capsys):
    argv = ["plan", "--dataset", "chartqa", "--model", "tiny", "--gpus", "4", "--ep", "2", "--global-batch", "8",
            "--microbatch-size", "1", "--iterations", "1", "--json"]  # fmt: skip
    assert main(argv) != 0
    assert "--ep 2 shards mixture-of-experts layers; tiny has none" in capsys.readouterr().err
