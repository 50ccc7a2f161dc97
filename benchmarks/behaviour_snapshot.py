"""Whether two commits behave alike on the command line: for every ``entrain`` command (the argparse
tree of ``entrain.cli.main.build_parser``) its ``--help`` text, and for every command with ``--json``
the JSON of one cheap, deterministic invocation, captured in a copy of each commit and compared.

    python benchmarks/behaviour_snapshot.py --before COMMIT [--after HEAD]

Each commit is copied with ``git archive`` into a temporary folder and captured in a fresh Python
process with that folder first on ``PYTHONPATH`` (``--after .`` captures the working tree as it is).
The commands that read a run (``export``, ``plot-trace``, ``profile --from-trace``) read the same
traced run, trained once by the ``--after`` code, so a refit sees the same measured times in both.
Prints every difference and exits 1 on any, 0 when every help text and JSON is the same.

Fields whose values legitimately differ from run to run are replaced before comparing, and only
these (``RUN_DEPENDENT``): measured wall times and the refit and measured numbers that come from
them, and the temporary folders (``<tmp>``) and the copied tree (``<tree>``) in any string.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# command ("*": every one) -> key -> why its value differs between two runs of the same code; such
# values become "<run-dependent>" wherever the key appears in that command's JSON
RUN_DEPENDENT: dict[str, dict[str, str]] = {
    "*": {"wall_s": "wall time of the command"},
    "profile measured": {
        key: "fitted to times measured on this machine"
        for key in ("ms", "r2", "worst_rel_residual", "used_r2", "used_worst_rel_residual", "table")
    },
}
HELP_COLUMNS = "100"  # argparse wraps help text to $COLUMNS


def _tiny(*argv: str) -> list[str]:
    return ["--model", "tiny", "--dataset", "skewed", *argv]


# name -> argv of one cheap invocation printing JSON; {tmp} is a scratch folder, {run} the shared run
INVOCATIONS: dict[str, list[str]] = {
    "data families": ["data", "families", "--json"],
    "data stats": ["data", "stats", "--dataset", "skewed", "--num-samples", "20", "--json"],
    "data check": ["data", "check", "{tmp}/synth/data.json", "--no-processor", "--json"],
    "plan": ["plan", *_tiny("--gpus", "4", "--global-batch", "8", "--json")],
    "assign": ["assign", *_tiny("--gpus", "4", "--global-batch", "8", "--iterations", "1", "--json")],
    "simulate": [
        "simulate",
        *_tiny("--gpus", "4", "--global-batch", "8", "--iterations", "1", "--json"),
        "--systems",
        "entrain,entrain-1f1b,1f1b,disttrain,dip,dip-greedy",
    ],
    "bench paper": ["bench", "paper", "--quick", "--jobs", "1", "--out", "{tmp}/paper.md", "--json"],
    "profile measured": [
        "profile",
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--tokens",
        "8,16",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--out",
        "{tmp}/profile.json",
        "--json",
    ],  # fmt: skip
    "profile from-trace": ["profile", "--from-trace", "{run}", "--out", "{tmp}/refit.json", "--json"],
    "export": ["export", "{run}", "--out", "{tmp}/export", "--json"],
    "plot-trace": ["plot-trace", "{run}", "--out", "{tmp}/trace.png", "--json"],
}
# made once by the --after code, read by both captures
SETUP: dict[str, list[str]] = {
    "synth": ["data", "synth", "--dataset", "cocoqa", "--num-samples", "3", "--out", "{tmp}/synth"],
    "run": [
        "train",
        *_tiny("--system", "dip", "--global-batch", "4", "--microbatch-size", "1", "--steps", "2"),
        "--no-progress",
        "--trace",
        "--out",
        "{run}",
    ],  # fmt: skip
}


def _fill(argv: list[str], tmp: str, run: str) -> list[str]:
    return [a.replace("{tmp}", tmp).replace("{run}", run) for a in argv]


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command of the argparse tree, depth first, the root as ``()``."""
    out = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += command_paths(sub, (*prefix, name))
    return out


def _run(argv: list[str]) -> dict:
    """``entrain ARGV`` in this process: exit code and stdout (stderr dropped: progress and logs)."""
    from entrain.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    return {"exit": rc, "stdout": out.getvalue()}


def setup(tmp: str, run: str) -> None:
    for name, argv in SETUP.items():
        got = _run(_fill(argv, tmp, run))
        if got["exit"] != 0:
            raise SystemExit(f"setup {name} failed ({got['exit']}): {' '.join(argv)}")


def capture(tmp: str, run: str) -> dict:
    """Help text of every command and the JSON of every invocation, as this process's entrain gives
    them (nothing normalised yet)."""
    from entrain.cli.main import build_parser

    helps = {}
    for path in command_paths(build_parser()):
        helps[" ".join(("entrain", *path))] = _run([*path, "--help"])["stdout"]
    results = {}
    for name, argv in INVOCATIONS.items():
        got = _run(_fill(argv, tmp, run))
        try:
            got["json"] = json.loads(got.pop("stdout"))
        except json.JSONDecodeError as e:
            got["json_error"] = str(e)
        results[name] = got
    return {"help": helps, "json": results}


def normalise(value, roots: dict[str, str], keys: dict[str, str] | None = None, key: str | None = None):
    """``value`` with each field named in ``keys`` replaced by ``"<run-dependent>"`` and each folder of
    ``roots`` (path -> placeholder) in a string replaced by its placeholder."""
    keys = RUN_DEPENDENT["*"] if keys is None else keys
    if key in keys:
        return "<run-dependent>"
    if isinstance(value, dict):
        return {k: normalise(v, roots, keys, k) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, roots, keys) for v in value]
    if isinstance(value, str):
        for path, placeholder in sorted(roots.items(), key=lambda kv: -len(kv[0])):
            value = value.replace(path, placeholder)
    return value


def normalised(snapshot: dict, roots: dict[str, str]) -> dict:
    """A capture's help texts and JSON with the run-dependent fields of ``RUN_DEPENDENT`` and the
    folders of ``roots`` replaced."""
    helps = {k: normalise(v, roots) for k, v in snapshot["help"].items()}
    results = {
        name: normalise(got, roots, {**RUN_DEPENDENT["*"], **RUN_DEPENDENT.get(name, {})})
        for name, got in snapshot["json"].items()
    }
    return {"help": helps, "json": results}


def _leaves(value, path: str = "") -> dict[str, object]:
    """A JSON value flattened to ``path -> scalar`` (``a.b[2].c``)."""
    if isinstance(value, dict):
        if not value:
            return {path: {}}
        out = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{path}.{k}" if path else k))
        return out
    if isinstance(value, list):
        if not value:
            return {path: []}
        out = {}
        for i, v in enumerate(value):
            out.update(_leaves(v, f"{path}[{i}]"))
        return out
    return {path: value}


def differences(before: dict, after: dict) -> list[str]:
    """One line per differing JSON leaf, a unified diff per differing help text, a line per command or
    invocation present on one side only."""
    out = []
    for name in sorted(set(before["help"]) | set(after["help"])):
        a, b = before["help"].get(name), after["help"].get(name)
        if a is None or b is None:
            out.append(f"help {name}: only {'after' if a is None else 'before'}")
        elif a != b:
            diff = difflib.unified_diff(a.splitlines(), b.splitlines(), "before", "after", lineterm="")
            out.append(f"help {name}:\n" + "\n".join(diff))
    for name in sorted(set(before["json"]) | set(after["json"])):
        a, b = before["json"].get(name), after["json"].get(name)
        if a is None or b is None:
            out.append(f"json {name}: only {'after' if a is None else 'before'}")
            continue
        if ("json" in a) != ("json" in b):  # one side printed no JSON: its exit code and error say why
            out.append(
                f"json {name}: exit {a['exit']} -> {b['exit']}, {a.get('json_error')} -> {b.get('json_error')}"
            )
            continue
        la, lb = _leaves(a), _leaves(b)
        for leaf in sorted(set(la) | set(lb), key=lambda p: (p not in la, p)):
            va, vb = la.get(leaf, "<absent>"), lb.get(leaf, "<absent>")
            if va != vb:
                out.append(f"json {name}: {leaf}: {json.dumps(va)} -> {json.dumps(vb)}")
    return out


def _tree(commit: str, into: Path) -> Path:
    """A copy of ``commit``'s files (``.``: the working tree itself)."""
    if commit == ".":
        return REPO
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def _in_tree(tree: Path, *args: str) -> None:
    """This script run by a fresh Python with ``tree``'s entrain first on the path."""
    env = dict(os.environ, PYTHONPATH=str(tree), COLUMNS=HELP_COLUMNS, PYTHONHASHSEED="0")
    subprocess.run(
        [sys.executable, "-P", __file__, *args, "--tree", str(tree)], env=env, check=True, cwd=tree
    )


def snapshot(commit: str, work: Path, run: str, first: bool) -> dict:
    tree = _tree(commit, work / f"tree-{commit.replace('/', '_')}")
    tmp = work / f"tmp-{commit.replace('/', '_')}"
    tmp.mkdir()
    if first:
        _in_tree(tree, "--setup", str(work / "shared"), "--run", run)
    os.symlink(work / "shared" / "synth", tmp / "synth")
    out = work / f"{tmp.name}.json"
    _in_tree(tree, "--capture", str(out), "--tmp", str(tmp), "--run", run)
    roots = {str(tmp): "<tmp>", str(work): "<tmp>", str(tree): "<tree>"}
    return normalised(json.loads(out.read_text()), roots)


def compare(before: str, after: str, keep: bool = False) -> list[str]:
    work = Path(tempfile.mkdtemp(prefix="behaviour-"))
    run = str(work / "shared" / "run")
    try:
        after_snap = snapshot(after, work, run, first=True)
        before_snap = snapshot(before, work, run, first=False)
    finally:
        if not keep:
            subprocess.run(["rm", "-rf", str(work)], check=False)
    return differences(before_snap, after_snap)


def _internal(args) -> int:
    import entrain

    where = Path(entrain.__file__).resolve()
    if Path(args.tree).resolve() not in where.parents:
        raise SystemExit(f"entrain imported from {where}, not from {args.tree}")
    if args.setup:
        setup(args.setup, args.run)
    else:
        Path(args.capture).write_text(json.dumps(capture(args.tmp, args.run), indent=1, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="commit to compare from")
    ap.add_argument("--after", default="HEAD", help="commit to compare to (`.`: the working tree)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copies and captures")
    for internal in ("--capture", "--setup", "--tmp", "--run", "--tree"):
        ap.add_argument(internal, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.capture or args.setup:
        return _internal(args)
    if not args.before:
        ap.error("--before COMMIT is required")
    diffs = compare(args.before, args.after, keep=args.keep)
    for line in diffs:
        print(line)
    print(f"{len(diffs)} difference(s) between {args.before} and {args.after}")
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
