"""``--config FILE`` for ``train``, ``plan`` and ``simulate``: flag values from a file, the command line
winning.

A TOML file's keys are the command's flag names with ``_`` for ``-`` (``global_batch = 256``,
``vision_model = "ckpt/qwen25vl-3b"``, ``trace = true``); a table is not allowed, a list becomes a
comma list (``system = ["entrain", "1f1b"]``). A run folder's ``config.json`` (``entrain train``)
is accepted too: its ``flags`` object holds the flags the run was started with, so giving it back
reproduces the run. Each value is checked like the flag itself (type, choices); an unknown key or a
bad value is a one-line ConfigError naming the file and the key. A key that is a flag of another
command only (``steps`` of a run's config.json given to ``plan``), and a run config's ``out`` (the run
folder) given to another command, are ignored with a one-line note on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib

from entrain.core.errors import ConfigError

__all__ = ["add_config_arg", "config_defaults", "read_config_file", "CONFIG_COMMANDS"]

CONFIG_COMMANDS = ("train", "plan", "simulate")


def add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE.toml",
        help="flag values from a TOML file (keys = flag names with _ for -) or a run's config.json; "
        "flags given on the command line win",
    )


COMMAND_LINE_ONLY = ("overwrite", "resume")
"""Flags a config file never sets: they wipe or continue the run folder, so only the command line
gives them (``train --config RUN/config.json`` of a run started with ``--overwrite`` must not wipe it;
a run's config.json records them as the run was started). A file that sets one gets a one-line note."""


def read_config_file(path: str) -> dict:
    """The flag values of ``path`` (TOML, or a run folder's config.json) as a dict, without the
    ``COMMAND_LINE_ONLY`` flags (a note on stderr names those set)."""
    values = _read_values(path)
    found = {k: values.pop(k) for k in list(values) if k.replace("-", "_") in COMMAND_LINE_ONLY}
    dropped = [k for k, value in found.items() if value]
    if dropped:
        flags = ", ".join("--" + k.replace("_", "-") for k in dropped)
        print(
            f"entrain: note: --config {path}: ignoring {flags} (given only on the command line)",
            file=sys.stderr,
        )
    return values


def _read_values(path: str) -> dict:
    if not os.path.isfile(path):
        raise ConfigError(f"--config {path}: no such file")
    try:
        if path.endswith(".json"):
            with open(path) as f:
                data = json.load(f)
            if isinstance(data, dict) and isinstance(data.get("flags"), dict):
                return data["flags"]
            if not isinstance(data, dict):
                raise ConfigError(f"--config {path}: expected a JSON object")
            return data
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config {path}: not valid TOML/JSON ({e})") from None


def _value(path: str, key: str, action: argparse.Action, value):
    where = f"--config {path}: {key}"
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} = {value!r}: expected true or false")
        return value
    if isinstance(value, dict):
        raise ConfigError(f"{where}: a table is not a flag value")
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    text = str(value).lower() if isinstance(value, bool) else str(value)
    try:
        value = action.type(text) if action.type is not None else text
    except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
        raise ConfigError(f"{where} = {value!r}: {e}") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{where} = {value!r}: choose from {', '.join(map(str, action.choices))}")
    return value


RUN_FOLDER_KEYS = ("out",)
"""Keys of a run's config.json that name the run folder: another command's flag of that name (a
plan or simulation output file) is not the run's, so they are ignored there."""


def _is_run_config(path: str) -> bool:
    """Whether ``path`` is a run folder's config.json (``entrain train``'s flags under ``flags``)."""
    if not path.endswith(".json"):
        return False
    with open(path) as f:
        data = json.load(f)
    return isinstance(data, dict) and isinstance(data.get("flags"), dict)


def config_defaults(
    parser: argparse.ArgumentParser, path: str, elsewhere: frozenset[str] = frozenset()
) -> dict:
    """``{dest: value}`` of ``path`` for ``parser``'s flags, checked (None values are left out).

    A key that is no flag of this command but one of another (``elsewhere``: e.g. ``steps`` of a
    run's config.json given to ``plan``) is ignored with a one-line note on stderr; any other key is
    an error (a typo)."""
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in ("help", "config")}
    out, ignored = {}, []
    for key, value in read_config_file(path).items():
        dest = key.replace("-", "_")
        run_folder = dest in RUN_FOLDER_KEYS and parser.prog != "entrain train" and _is_run_config(path)
        if (dest not in actions and dest in elsewhere) or run_folder:
            ignored.append(key)
            continue
        if dest not in actions:
            raise ConfigError(f"--config {path}: unknown key {key!r} (not a flag of this command)")
        if value is not None:
            out[dest] = _value(path, key, actions[dest], value)
    if ignored:
        print(
            f"{parser.prog}: note: --config {path}: ignoring {', '.join(ignored)} "
            "(other commands' flags, or the run folder)",
            file=sys.stderr,
        )
    return out
