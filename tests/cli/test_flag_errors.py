"""Every command rejects bad flag values at parse time as one line with exit status 2 (docs/contract.md,
Additions): zero, negative and absurd sizes, an empty system list, a missing or malformed profile,
and an output path that cannot be written. The table is every flag of every command that
``entrain.cli.argtypes`` checks, found by walking the parsers, so a new command is covered too."""

from __future__ import annotations

import argparse

import pytest

from entrain.cli import argtypes
from entrain.cli.main import build_parser, main


def _commands() -> dict[str, argparse.ArgumentParser]:
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out[parser.prog] = parser
        for action in subs:
            for sub in dict.fromkeys(action.choices.values()):
                walk(sub)

    walk(build_parser())
    return out


COMMANDS = _commands()


def _flag(action: argparse.Action) -> str | None:
    longs = [o for o in action.option_strings if o.startswith("--")]
    return longs[0] if longs else None


def _cases(tmp_path_factory) -> list[tuple[str, str, list[str]]]:
    folder = tmp_path_factory.mktemp("flags")
    a_file = folder / "a-file"
    a_file.write_text("x")
    malformed = folder / "profile.json"
    malformed.write_text('{"model": "tiny"')
    not_a_profile = folder / "other.json"
    not_a_profile.write_text('{"hello": 1}')
    cases = []
    for prog, parser in COMMANDS.items():
        argv = prog.split()[1:]
        for action in parser._actions:
            flag = _flag(action)
            rule = argtypes.PER_COMMAND.get((prog, action.dest), argtypes.RULES.get(action.dest))
            if flag is None or rule is None or action.choices is not None or action.nargs == 0:
                continue
            bad: dict[str, str] = {}
            if isinstance(rule, argtypes.Number):
                if rule.low is not None:
                    bad["below"] = str(rule.low - 1) if rule.kind is int else "-1"
                    bad["zero-or-negative"] = "-1"
                bad["absurd"] = "1e300" if rule.kind is float else str(2**63)
                bad["not-a-number"] = "many"
            elif rule is argtypes.systems_list:
                bad = {"empty": "", "only-commas": ",", "unknown": "nope"}
            elif rule is argtypes.profile_file:
                bad = {"missing": str(folder / "none.json"), "malformed": str(malformed),
                       "not-a-profile": str(not_a_profile), "a-folder": str(folder)}  # fmt: skip
            elif rule in argtypes.OUTPUT_CHECKS:
                bad = {"under-a-file": str(a_file / "out"), "deep-under-a-file": str(a_file / "x" / "y")}
                if rule not in (argtypes.output_dir, argtypes.run_dir_out):
                    bad["a-folder"] = str(folder)
                else:
                    bad["a-file"] = str(a_file)
                if rule is argtypes.image_file:
                    bad["not-an-image-format"] = str(folder / "plot.txt")
            else:
                bad = {"missing": str(folder / "none")}
            cases += [(prog, name, [*argv, f"{flag}={value}"]) for name, value in bad.items()]
    return cases


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return _cases(tmp_path_factory)


def test_the_table_covers_every_command_and_class(cases):
    progs = {prog for prog, _, _ in cases}
    valued = {  # commands with a flag that takes a value (``data families`` has only --json)
        prog
        for prog, parser in COMMANDS.items()
        if any(_flag(a) and a.nargs != 0 and a.choices is None and a.dest != "help" for a in parser._actions)
    }
    assert progs == valued and set(COMMANDS) - valued == {"entrain data families"}
    names = {name for _, name, _ in cases}
    assert {"zero-or-negative", "absurd", "empty", "missing", "malformed", "under-a-file"} <= names
    for prog in (
        "entrain train",
        "entrain bench paper",
        "entrain profile",
        "entrain data synth",
        "entrain export",
    ):
        assert any(p == prog and n == "under-a-file" for p, n, _ in cases), prog


def test_every_bad_value_is_one_line_at_parse_time(cases, capsys):
    parser = build_parser()
    for prog, name, argv in cases:
        with pytest.raises(SystemExit) as info:
            parser.parse_args(argv)  # parse time: no command ran
        err = capsys.readouterr().err
        assert info.value.code == 2, (prog, name, argv)
        assert err.startswith(f"{prog}: error: ") and err.count("\n") == 1, (prog, name, err)
        assert "Traceback" not in err


@pytest.mark.parametrize("command", ["plan", "assign", "simulate", "train"])
def test_a_batch_too_big_for_memory_is_refused_before_work(command, capsys):
    big = str(argtypes.MAX_COUNT)
    rounds = ["--steps" if command == "train" else "--iterations", big]
    assert main([command, "--global-batch", big, *rounds]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"entrain {command}: error: --global-batch {big}") and err.count("\n") == 1
    assert "memory available" in err
