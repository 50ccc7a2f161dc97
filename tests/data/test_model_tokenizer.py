"""A stock LLM's tokenizer: its chat template gives the same ids and
labels as Hugging Face's ``apply_chat_template``; image tokens are added when missing; a folder
without tokenizer files falls back to the built-in Qwen2 tokenizer only for Qwen2's vocabulary."""

from __future__ import annotations

import pytest

from entrain.core.errors import ConfigError
from entrain.data.processing import format_chat
from entrain.data.tokenizer import IMAGE_TOKENS, model_tokenizer
from tests.models.stock import save_tokenizer

CONVERSATIONS = [
    [("user", "<image>What is shown in the chart?"), ("assistant", "The bars rise from left to right.")],
    [("system", "Describe the image."), ("user", "How many apples? <image> and <image>"),
     ("assistant", "There are three apples."), ("user", "A cat?"), ("assistant", "A cat sits on a red mat.")],
]  # fmt: skip


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


def _expanded(turns, counts):
    from entrain.data.processing import _expand

    out, k = [], 0
    for role, text in turns:
        body, k = _expand(text, counts, k)
        out.append({"role": role, "content": body})
    return out


@pytest.mark.parametrize("turns", CONVERSATIONS)
def test_ids_and_labels_equal_hugging_face_chat_template(tok_dir, turns):
    from transformers import AutoTokenizer

    tok = model_tokenizer(str(tok_dir), str(tok_dir), 290)
    assert tok.added == IMAGE_TOKENS  # the trained tokenizer has none of them
    counts = [3, 5][: sum(t.count("<image>") for _, t in turns)]
    ids, labels = format_chat(turns, counts, tok)
    hf = AutoTokenizer.from_pretrained(tok_dir)
    hf.add_tokens(list(IMAGE_TOKENS), special_tokens=True)
    ref = hf.apply_chat_template(
        _expanded(turns, counts), tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert ids == list(ref["input_ids"])
    assert labels == [i if m else -100 for i, m in zip(ref["input_ids"], ref["assistant_masks"])]
    assert ids.count(tok.token_id("<|image_pad|>")) == sum(counts)


def test_folder_without_tokenizer_files(tmp_path):
    with pytest.raises(ConfigError, match="no tokenizer files .* vocab_size 32000"):
        model_tokenizer(None, str(tmp_path), 32000)
    assert model_tokenizer(None, str(tmp_path), 151_936).name == "qwen2-offline"
