"""``entrain train --plan FILE``: the plan file decides the run's model (a preset, or the checkpoint
folders it records in ``model_source``), dataset, pixel limits, batch
sizes, system and layout (``entrain.core.planning.plan_file.RUN_FIELDS``). A flag left at its default takes the
plan's value; a flag given with another value is a one-line error before any process starts (a
different dataset only with ``--allow-other-dataset``)."""

from __future__ import annotations

import argparse
import os
import sys

from entrain.cli.common import vision_limits
from entrain.core.errors import ConfigError
from entrain.core.planning.plan_file import checkpoint_fingerprints, load_plan_dict
from entrain.models.families.registry import preset_names

__all__ = ["apply_plan", "given_dests", "same_dataset"]


def _plan_values(d: dict) -> dict:
    """``{dest: the plan's value}`` of the train flags a plan fixes."""
    stages = d["layout"]["stages"]
    return {
        "system": d["system"],
        "global_batch": d["global_batch"],
        "microbatch_size": d["microbatch_size"],
        "min_pixels": d["min_pixels"],
        "max_pixels": d["max_pixels"],
        "dp": d["layout"]["dp"],
        "tp": d["layout"]["components"][stages[0].get("encoder", stages[0]["component"])]["tp"],
        "encoder_stages": sum(1 for s in stages if s["component"] == "encoder"),
        "llm_stages": sum(1 for s in stages if s["component"] == "llm"),
    }


_APPLIED = ("global_batch", "microbatch_size")
"""Flags set to the plan's value when left at their default (the others: ``--plan`` replaces them
in ``RunConfig``; pixel limits and the model are applied on their own)."""


def given_dests(args: argparse.Namespace, defaults: dict, actions: list[argparse.Action]) -> set[str]:
    """The flags given on the command line (``args.command_line``, set by ``entrain.cli.main``; a
    unique prefix counts, as argparse takes it) or by ``--config`` (a value other than the default)."""
    given = {dest for dest, value in vars(args).items() if dest in defaults and value != defaults[dest]}
    for token in getattr(args, "command_line", ()):
        name = token.split("=", 1)[0]
        if not name.startswith("--"):
            continue
        exact = [a.dest for a in actions if name in a.option_strings]
        prefix = [a.dest for a in actions if any(o.startswith(name) for o in a.option_strings)]
        given.update(exact or (prefix if len(prefix) == 1 else []))
    return given


def apply_plan(
    args: argparse.Namespace, defaults: dict, actions: list[argparse.Action], *, quiet: bool = False
) -> None:
    """Check the flags given beside ``--plan`` against the plan file and set the ones not given to
    the plan's values (``ConfigError`` naming the flag and both values otherwise)."""
    path = args.plan
    d = load_plan_dict(path)
    given_flags = given_dests(args, defaults, actions)
    for dest, value in _plan_values(d).items():
        given = getattr(args, dest)
        flag = "--" + dest.replace("_", "-")
        if dest not in given_flags:
            if dest in _APPLIED:
                setattr(args, dest, value)
        elif given != value:
            raise ConfigError(
                f"--plan {path} was made with {flag} {value}, but {flag} {given} was given: drop {flag} "
                f"or write a plan for it (entrain plan ... {flag} {given} --out FILE)"
            )
    stock = any(getattr(args, f, None) for f in ("vision_model", "llm_model", "model_path"))
    if "model" not in given_flags and not stock and d["model"] in preset_names():
        args.model = d["model"]
    if "model" not in given_flags and not stock:  # the checkpoint folders the plan was made with
        for dest, folder in (d.get("model_source") or {}).items():
            setattr(args, dest, folder)
    _check_fingerprints(args, d)
    _apply_pixels(args, d, given_flags)
    _apply_dataset(args, "dataset" in given_flags, d["dataset"], quiet)


def _apply_pixels(args: argparse.Namespace, d: dict, given_flags: set[str]) -> None:
    """The plan's pixel limits as flags where they are not the model family's own (a family's "no
    limit" placeholder is no flag value: the workers' flag parser would refuse it)."""
    own = vision_limits(argparse.Namespace(**{**vars(args), "min_pixels": None, "max_pixels": None}))
    for dest in ("min_pixels", "max_pixels"):
        if dest not in given_flags and d[dest] != getattr(own, dest):
            setattr(args, dest, d[dest])


def _check_fingerprints(args: argparse.Namespace, d: dict) -> None:
    """ConfigError when a checkpoint folder of this run holds other content (config.json, processor
    config, tensor names / shapes / dtypes) than the one the plan was made with, whatever its name."""
    planned = d.get("checkpoint_fingerprint") or {}
    folders = {k: getattr(args, k, None) for k in planned}
    for dest in (k for k, v in folders.items() if not v):
        was = (d.get("model_source") or {}).get(dest, "?")
        raise ConfigError(
            f"--plan {args.plan} was made for the checkpoint {was} (--{dest.replace('_', '-')}), but this run "
            f"does not train it: drop the model flags or write a plan for this model"
        )
    for dest, now in checkpoint_fingerprints(folders).items():
        if now != planned[dest]:
            flag = "--" + dest.replace("_", "-")
            was = (d.get("model_source") or {}).get(dest, "?")
            raise ConfigError(
                f"--plan {args.plan} was made for the checkpoint {was} (fingerprint {planned[dest][:12]}), but "
                f"{flag} {folders[dest]} holds other content (fingerprint {now[:12]}: its config.json, "
                f"preprocessor_config.json or tensors differ): write the plan again for it"
            )


def _apply_dataset(args: argparse.Namespace, given: bool, planned: str, quiet: bool) -> None:
    if not given:
        args.dataset = planned
    elif not same_dataset(args.dataset, planned):
        if not args.allow_other_dataset:
            raise ConfigError(
                f"--plan {args.plan} was made for dataset {planned!r}, but --dataset {args.dataset!r} was "
                "given: drop --dataset, write a plan for this dataset, or pass --allow-other-dataset to "
                "run the plan on it anyway"
            )
        if not quiet:
            print(
                f"entrain train: note: running the plan made for dataset {planned!r} on {args.dataset!r} "
                "(--allow-other-dataset)",
                file=sys.stderr,
            )


def same_dataset(a: str, b: str) -> bool:
    """The same built-in dataset name, or paths to the same file or folder."""
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
