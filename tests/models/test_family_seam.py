"""Outside ``entrain/models/families/`` no code names a model family: the names each registered family
declares (``ModelFamily.code_names``: its registry name, model_type values, transformers class stems)
appear only in docstrings and comments there, except in the files of ``ALLOWED`` (each with its reason).
"""

from __future__ import annotations

import io
import pathlib
import tokenize

from entrain.models.families.registry import families

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "entrain"
FAMILIES = PACKAGE / "models" / "families"

ALLOWED: dict[str, str] = {}
"""Files outside the family folders allowed to name a family in code, and why."""

_STATEMENT_START = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING)


def _code_tokens(source: str):
    """``(line, text)`` of every name and string token that is code: comments and docstrings (a string
    that starts a statement) are left out."""
    prev = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL):
            continue
        is_docstring = tok.type == tokenize.STRING and prev in _STATEMENT_START
        if not is_docstring and tok.type in (
            tokenize.NAME,
            tokenize.STRING,
            getattr(tokenize, "FSTRING_MIDDLE", -1),
        ):
            yield tok.start[0], tok.string
        prev = tok.type


def family_mentions(names: tuple[str, ...]) -> dict[str, list[str]]:
    """Per file of ``entrain/`` outside the family folders, ``"line: name"`` of each code mention."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(FAMILIES):
            continue
        rel = str(path.relative_to(ROOT))
        for line, text in _code_tokens(path.read_text()):
            found.setdefault(rel, []).extend(f"{line}: {n}" for n in names if n in text)
    return {k: v for k, v in found.items() if v}


def _all_code_names() -> tuple[str, ...]:
    return tuple(n for f in families() for n in f.code_names())


def test_no_code_outside_the_family_folders_names_a_family():
    names = _all_code_names()
    assert "composition" in names and "Llama" in names  # the registry declares them
    found = family_mentions(names)
    unexpected = {f: hits for f, hits in found.items() if f not in ALLOWED}
    assert not unexpected, f"code outside entrain/models/families names a model family: {unexpected}"


def test_every_allowed_file_still_needs_its_exception():
    names = _all_code_names()
    stale = [
        f
        for f in sorted(ALLOWED)
        if not any(n in text for _, text in _code_tokens((ROOT / f).read_text()) for n in names)
    ]
    assert not stale, f"drop these from ALLOWED (they no longer name a family): {stale}"


def test_the_scan_sees_code_but_not_docstrings_or_comments():
    source = '"""Llama docstring."""\n# Llama comment\nx = "LlamaConfig"\n\ndef f():\n    """Llama."""\n    return Llama\n'
    assert [line for line, text in _code_tokens(source) if "Llama" in text] == [3, 7]
