"""``entrain data stats``: JSON validated against entrain/schemas/data_stats.json, table, plot, errors."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from entrain.cli.main import main
from entrain.core.costs.presets import build_cost_model
from entrain.data.generators import generate_samples
from entrain.data.workload_io import write_workload_jsonl

QUANTITIES = ("text_tokens", "image_tokens", "vit_patches", "encoder_llm_ratio")


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(resources.files("entrain").joinpath("schemas/data_stats.json").read_text())


def run_json(capsys, argv: list[str]) -> dict:
    assert main(["data", "stats", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("dataset", ["synthchartnet", "llava_instruct_150k", "skewed"])
def test_stats_json_matches_schema(capsys, schema, dataset):
    out = run_json(capsys, ["--dataset", dataset, "--num-samples", "400", "--seed", "2"])
    jsonschema.validate(out, schema)
    assert out["num_samples"] == 400
    for q in QUANTITIES:
        s = out[q]
        assert s["p5"] <= s["p50"] <= s["p95"]
    samples = generate_samples(dataset, 400, seed=2)
    assert out["text_tokens"]["mean"] == pytest.approx(sum(s.text_tokens for s in samples) / 400)
    assert out["vit_patches"]["mean"] == pytest.approx(4 * out["image_tokens"]["mean"])


def test_ratio_uses_the_named_cost_model(capsys):
    out_1b = run_json(capsys, ["--dataset", "cocoqa", "--num-samples", "200"])
    out_3b = run_json(
        capsys, ["--dataset", "cocoqa", "--num-samples", "200", "--model", "qwen25vl-llama3-3b"]
    )
    cost = build_cost_model("qwen25vl-llama3-3b", "a40-paper")
    ratios = sorted(w.encoder / w.llm for w in map(cost.sample_work, generate_samples("cocoqa", 200, 0)))
    assert out_3b["encoder_llm_ratio"]["mean"] == pytest.approx(sum(ratios) / 200)
    # a larger LLM lowers the encoder:LLM ratio
    assert out_3b["encoder_llm_ratio"]["mean"] < out_1b["encoder_llm_ratio"]["mean"]


def test_fig4_setup_and_attention_flag(capsys, tmp_path, schema):
    """``--hardware a40-fig4`` prices the full-attention tower with eager scores (paper Fig. 4: COCO-QA
    ~3-4); ``--attention flash`` on the same preset drops the score traffic; a bad spec or one next
    to a measured profile is a one-line error."""
    argv = ["--dataset", "cocoqa", "--num-samples", "300", "--model", "qwen25vl-fullatt-llama3-1b"]
    fig4 = run_json(capsys, [*argv, "--hardware", "a40-fig4"])
    flash = run_json(capsys, [*argv, "--hardware", "a40-fig4", "--attention", "flash"])
    assert fig4["attention"] == {"encoder": "eager", "llm": "flash"}
    assert flash["attention"] == {"encoder": "flash", "llm": "flash"}
    jsonschema.validate(fig4, schema)
    assert 2.7 <= fig4["encoder_llm_ratio"]["p50"] <= 4.4
    assert flash["encoder_llm_ratio"]["p50"] < fig4["encoder_llm_ratio"]["p50"] / 2
    assert main(["data", "stats", *argv, "--attention", "sdpa"]) == 2
    assert "attention 'sdpa'" in capsys.readouterr().err
    profile = tmp_path / "p.json"
    build_cost_model("qwen25vl-fullatt-llama3-1b", "a40-flops").save(str(profile))
    assert main(["data", "stats", *argv, "--profile", str(profile), "--attention", "eager"]) == 2
    assert "--attention applies to presets" in capsys.readouterr().err


def test_workload_file_and_human_table(capsys, tmp_path, schema):
    path = str(tmp_path / "w.jsonl")
    write_workload_jsonl(path, generate_samples("chartqa", 30, seed=0))
    out = run_json(capsys, ["--dataset", path])
    jsonschema.validate(out, schema)
    assert out["num_samples"] == 30 and out["dataset"] == path
    assert main(["data", "stats", "--dataset", path, "--num-samples", "10"]) == 0
    text = capsys.readouterr().out
    assert "10 samples" in text
    for q in QUANTITIES:
        assert q in text


def test_plot_writes_png(capsys, tmp_path):
    png = tmp_path / "cdf.png"
    assert (
        main(["data", "stats", "--dataset", "chartqa", "--num-samples", "300", "--plot", str(png), "--json"])
        == 0
    )
    json.loads(capsys.readouterr().out)  # stdout stays one JSON object
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "coco"], "neither a built-in dataset"),
        (["--dataset", "cocoqa", "--num-samples", "0"], "--num-samples"),
        (["--dataset", "cocoqa", "--seed", "-1"], "seed"),
    ],
)
def test_errors_are_one_line(capsys, argv, message):
    assert main(["data", "stats", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_raw_work_file_is_refused(capsys, tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_text('{"id": "a", "encoder": 1, "llm": 2}\n')
    assert main(["data", "stats", "--dataset", str(path)]) == 2
    assert "no token metadata" in capsys.readouterr().err
