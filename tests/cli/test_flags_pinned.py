"""Every command's flags and help text, pinned in ``tests/cli/golden/cli_flags.txt``: a new, renamed or
reworded option is a deliberate change (docs/contract.md: flags are added, never renamed or dropped).

Regenerate the golden file after a deliberate change, then review its diff:

    python tests/cli/test_flags_pinned.py --write

A missing golden file fails the test; it is never written by the test itself."""

from __future__ import annotations

import argparse
import pathlib
import sys

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden" / "cli_flags.txt"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _describe(action: argparse.Action) -> str:
    flags = ", ".join(action.option_strings)
    parts = [flags, f"dest={action.dest}"]
    if action.nargs == 0:
        parts.append("switch")
    else:
        parts.append(f"default={action.default!r}")
    if action.choices is not None:
        parts.append(f"choices={list(action.choices)}")
    if action.type is not None:
        parts.append(f"type={getattr(action.type, '__name__', repr(action.type))}")
    if action.metavar is not None:
        parts.append(f"metavar={action.metavar}")
    help_text = " ".join((action.help or "").split())
    return "  " + "  ".join(parts) + f"\n      {help_text}"


def render(parser: argparse.ArgumentParser | None = None, prefix: str = "entrain") -> str:
    """Every command's help line and its options, commands in name order, options as declared."""
    if parser is None:
        from entrain.cli.main import build_parser

        parser = build_parser()
    lines = []
    for name, sub in sorted(_subparsers(parser).items()):
        command = f"{prefix} {name}"
        lines.append(f"## {command}")
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                lines.append(_describe(action))
            elif not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                lines.append(
                    f"  <{action.dest}>  nargs={action.nargs!r}\n      {' '.join((action.help or '').split())}"
                )
        lines.append("")
        nested = render(sub, command)
        if nested:
            lines.append(nested)
    return "\n".join(lines).rstrip() + "\n"


def test_every_commands_flags_and_help_are_pinned():
    assert GOLDEN.exists(), (
        f"{GOLDEN} is missing: write it with `python tests/cli/test_flags_pinned.py --write`"
    )
    expected = GOLDEN.read_text()
    actual = render()
    if actual != expected:
        import difflib

        diff = "".join(
            difflib.unified_diff(expected.splitlines(True), actual.splitlines(True), "golden", "now", n=1)
        )
        raise AssertionError(
            "the CLI's flags or help changed; if deliberate, run `python tests/cli/test_flags_pinned.py --write` "
            f"and commit the golden file:\n{diff}"
        )


def test_a_new_or_reworded_flag_is_caught():
    from entrain.cli.main import build_parser

    parser = build_parser()
    before = render(parser)
    _subparsers(parser)["train"].add_argument("--brand-new", default=1, help="an option nobody reviewed")
    assert "--brand-new" in render(parser) and render(parser) != before
    parser = build_parser()
    next(a for a in _subparsers(parser)["plan"]._actions if a.dest == "alpha").help = "reworded"
    assert render(parser) != before


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/cli/test_flags_pinned.py --write")
    GOLDEN.write_text(render())
    print(f"wrote {GOLDEN}")
