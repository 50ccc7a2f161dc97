"""Issue 23 requirement 2: each flag is defined once and every ``train`` flag is accounted for.

* a flag shared by ``train``, ``plan``, ``simulate`` and ``assign`` has one help text and one default
  everywhere, unless ``common.COMMAND_DEFAULTS`` / ``common.COMMAND_MEANINGS`` say why not;
* every ``train`` flag is recorded in the run's ``config.json`` (and so forwarded to the workers and
  to ``--config``) unless ``train.NOT_RECORDED`` says why, and is part of the resume fingerprint
  unless its config field's metadata (or ``config.FLAGS_WITHOUT_FIELD``) says why not;
* ``plan``, ``simulate``, ``assign`` and ``train`` read no flag from ``args`` after the RunConfig is built.
"""

from __future__ import annotations

import argparse

RUN_COMMANDS = ("train", "plan", "simulate", "assign")


def _actions() -> dict[str, dict[str, argparse.Action]]:
    from entrain.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    return {
        c: {a.dest: a for a in sub[c]._actions if a.option_strings and a.dest != "help"} for c in RUN_COMMANDS
    }


def shared_flag_mismatches(actions: dict[str, dict[str, argparse.Action]]) -> list[str]:
    """``dest: what differs`` for every flag two commands define differently without a stated reason."""
    from entrain.cli.common import COMMAND_DEFAULTS, COMMAND_MEANINGS

    problems = []
    for dest in sorted(set().union(*actions.values())):
        having = {c: acts[dest] for c, acts in actions.items() if dest in acts}
        if len(having) < 2 or COMMAND_MEANINGS.get(dest):
            continue
        helps = {a.help for a in having.values()}
        defaults = {repr(a.default) for c, a in having.items() if not COMMAND_DEFAULTS.get(c, {}).get(dest)}
        if len(helps) > 1:
            problems.append(f"{dest}: help differs between {', '.join(having)}")
        if len(defaults) > 1:
            problems.append(
                f"{dest}: default differs between {', '.join(having)} ({', '.join(sorted(defaults))})"
            )
    return problems


def test_a_shared_flag_has_one_help_and_one_default():
    from entrain.cli.common import COMMAND_DEFAULTS, COMMAND_MEANINGS

    assert shared_flag_mismatches(_actions()) == []
    reasons = [why for per in COMMAND_DEFAULTS.values() for _, why in per.values()] + list(
        COMMAND_MEANINGS.values()
    )
    assert all(len(why) > 20 for why in reasons)


def test_a_flag_redefined_with_other_help_or_default_is_caught():
    actions = _actions()
    actions["simulate"]["tp"] = argparse.Action(["--tp"], "tp", default=2, help="tp, reworded")
    assert shared_flag_mismatches(actions) == ["tp: help differs between train, plan, simulate, assign",
                                               "tp: default differs between train, plan, simulate, assign (1, 2)"]  # fmt: skip
