"""``entrain data families``: every registered model family — its name, one-line description, the
``--model`` presets it serves and the ``config.json`` ``model_type`` values a ``--model-path`` folder
of it declares (docs/contract.md ``entrain data``)."""

from __future__ import annotations

import argparse

from entrain.cli.common import add_shared_flags, emit_json
from entrain.models.families.registry import families


def add_families_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``families`` on the ``entrain data`` sub-subcommands."""
    p = subparsers.add_parser(
        "families",
        help="list the model families (presets, and the config.json model_type --model-path takes)",
    )
    add_shared_flags(p, "data families", "json")
    p.set_defaults(func=run_families)


def family_rows() -> list[dict]:
    """One row per registered family, in registration order (built-in families first)."""
    return [
        {
            "name": f.name,
            "description": f.description,
            "presets": list(f.preset_names()),
            "model_types": list(getattr(f, "model_types", tuple)()),
        }
        for f in families()
    ]


def format_families(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        lines += [
            f"{r['name']}: {r['description']}",
            f"  presets (--model):         {', '.join(r['presets']) or '-'}",
            f"  model_type (--model-path): {', '.join(r['model_types']) or '-'}",
        ]
    return "\n".join(lines)


def run_families(args: argparse.Namespace) -> int:
    rows = family_rows()
    if args.json:
        emit_json({"families": rows})
    else:
        print(format_families(rows))
    return 0
