"""``entrain`` command line. Each subcommand lives in its own module exposing
``add_parser(subparsers)``; ``main`` only dispatches and turns ``EntrainError`` into a one-line
message on stderr with exit code 2 (no traceback for a user's mistake)."""

from __future__ import annotations

import argparse
import importlib
import sys

from entrain import __version__
from entrain.cli.argtypes import EntrainParser, apply_rules, check_args
from entrain.core.errors import EntrainError

# subcommand -> module; a module registers its parser and sets ``func`` on it.
SUBCOMMANDS: dict[str, str] = {
    "data": "entrain.cli.data",
    "plan": "entrain.cli.plan",
    "assign": "entrain.cli.assign",
    "simulate": "entrain.cli.simulate",
    "bench": "entrain.cli.bench",
    "profile": "entrain.cli.profile",
    "train": "entrain.cli.train",
    "export": "entrain.cli.export",
    "plot-trace": "entrain.cli.plot_trace",
}


def build_parser() -> argparse.ArgumentParser:
    parser = EntrainParser(
        prog="entrain",
        description="Load-balanced distributed training of multimodal LLMs (Entrain).",
    )
    parser.add_argument("--version", action="version", version=f"entrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in SUBCOMMANDS.values():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name == module_name:  # subcommand not built yet
                continue
            raise
        module.add_parser(sub)
    apply_rules(parser)
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _all_flags(parser: argparse.ArgumentParser) -> frozenset[str]:
    """The destination names of every flag of every command (a shared config file's keys)."""
    out: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                out |= _all_flags(sub)
        elif action.option_strings:
            out.add(action.dest)
    return frozenset(out)


def with_config(parser: argparse.ArgumentParser, args: argparse.Namespace, argv) -> argparse.Namespace:
    """``--config FILE``: the file's values become the defaults of the command's flags and ``argv`` is
    parsed again over them, so the command line wins."""
    if not getattr(args, "config", None):
        return args
    from entrain.cli.config_file import config_defaults

    command = _subparser(parser, args.command)
    command.set_defaults(**config_defaults(command, args.config, _all_flags(parser)))
    return parser.parse_args(argv)


def _quiet_progress(args: argparse.Namespace) -> None:
    """No dataset-scanning progress bar under ``--json`` or ``--no-progress``."""
    from entrain.data.shards import set_progress

    set_progress(not (getattr(args, "json", False) or getattr(args, "no_progress", False)))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a bad flag (one line already on stderr), --help or --version
        return e.code if isinstance(e.code, int) else int(e.code is not None) * 2
    try:
        args = with_config(parser, args, argv)
        args.command_line = list(sys.argv[1:] if argv is None else argv)  # which flags were given
        check_args(args)
        _quiet_progress(args)
        rc = args.func(args)
    except EntrainError as e:
        print(f"entrain {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT
        print(f"entrain {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    raise SystemExit(main())
