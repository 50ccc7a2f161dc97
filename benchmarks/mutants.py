"""Mutation check: does the fast suite catch the bugs users would pay for?

Each mutant is one small textual edit of the library (a search string that must occur exactly once
in its file, and its replacement). The script copies the working tree (tracked and untracked, not
ignored files) to a scratch folder, checks that the tests named below pass there unmutated, then
for each mutant: applies it, runs the tests that should kill it (``-x``, slow tests excluded),
restores the file. A mutant whose search string is gone or ambiguous stops the run with
"mutant X no longer applies": update its edit to the refactored code rather than drop it.

    python benchmarks/mutants.py [--only NAME,...] [--out benchmarks/results/mutants.md]

The real tree is never modified. ``tests/test_mutants.py`` checks that every mutant still applies.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    path: str
    find: str
    replace: str
    tests: tuple[str, ...]
    """pytest node ids expected to kill it (all in the fast suite)."""


EXACT_2 = "tests/runtime/test_exact_gradients.py::test_gradients_match_reference[2]"
EXACT_EXT = "tests/runtime/test_exact_gradients_extensions.py"
QUALITY = "tests/core/test_assignment_quality.py"
PROPERTIES = "tests/core/test_assignment_properties.py"
GOLDEN = "tests/sim/test_golden.py"
RESUME = "tests/runtime/test_resume_multirank.py"

MUTANTS = (
    Mutant(
        "dp-gradient-scaling",
        "the DP all-reduce result divided by dp (a mean on top of the label-count normalisation)",
        "entrain/runtime/grad_buckets.py",
        "g.copy_(b.flat[offset : offset + g.numel()].view_as(g))",
        "g.copy_(b.flat[offset : offset + g.numel()].view_as(g) / dist.get_world_size(self.group))",
        (EXACT_2, "tests/runtime/test_grad_buckets.py"),
    ),
    Mutant(
        "loss-normalisation",
        "the loss scaled by dp / global label count (per-replica mean instead of the global one)",
        "entrain/runtime/trainer.py",
        "scale = 1.0 / max(1, self._global_labels(it))\n        if self.fault_hook",
        "scale = self.layout.dp / max(1, self._global_labels(it))\n        if self.fault_hook",
        (EXACT_2,),
    ),
    Mutant(
        "no-coarse-fine-split",
        "stratified assignment LPTs all samples in encoder order (no coarse set first)",
        "entrain/core/assignment/stratified.py",
        "return lpt_assign(coarse + fine, k_eff)",
        "return lpt_assign(sorted(samples, key=lambda s: (-s.encoder, s.id)), k_eff)",
        (QUALITY,),
    ),
    Mutant(
        "deferral-off",
        "pairwise deferral matches pairs but moves no sample",
        "entrain/core/assignment/hierarchical.py",
        "moved = cand.deferred(row, col) if defers else ()",
        "moved = ()",
        (QUALITY,),
    ),
    Mutant(
        "swapped-execution-order",
        "each pair runs UL before OL (the deferred samples then wait on a microbatch that ran earlier)",
        "entrain/core/assignment/hierarchical.py",
        "order = [m for ol, ul, _ in pairs for m in (ol, ul)]",
        "order = [m for ol, ul, _ in pairs for m in (ul, ol)]",
        (PROPERTIES, GOLDEN),
    ),
    Mutant(
        "sub-microbatch-routing-off-by-one",
        "the first LLM stage routes an encoder message's rows by the ids of the previous sub",
        "entrain/runtime/executor.py",
        "for sid in self._ids(stage - 1, mb, sub):",
        "for sid in self._ids(stage - 1, mb, sub - 1):",
        (EXACT_2,),
    ),
    Mutant(
        "skipped-rng-restore",
        "resume does not restore the Python / numpy / torch generator states",
        "entrain/runtime/session.py",
        'ck.set_rng_state(found.rank_state["rng"])',
        "pass",
        (RESUME,),
    ),
    Mutant(
        "skipped-optimizer-restore",
        "resume restores the parameters but not AdamW's moments and step counts",
        "entrain/runtime/trainer.py",
        "load(folder, {k: v for k, v in state.items() if k in saved})",
        'load(folder, {k: v for k, v in state.items() if k in saved and not k.startswith("optim/")})',
        (RESUME,),
    ),
    Mutant(
        "schedule-action-late",
        "1F1B-over-units emits the last warm-up forward one slot late (after the first backward)",
        "entrain/core/schedules/common.py",
        "    w = max(0, min(warmup, n))\n    out = [a for unit in fwd[:w] for a in unit]",
        "    w = max(0, min(warmup - 1, n))\n    out = [a for unit in fwd[:w] for a in unit]",
        (GOLDEN,),
    ),
)


class MutantDoesNotApply(RuntimeError):
    pass


def mutated_text(m: Mutant, root: Path) -> tuple[str, str]:
    """(original, mutated) text of ``m.path`` under ``root``; raises MutantDoesNotApply unless the
    search string occurs exactly once."""
    path = root / m.path
    if not path.exists():
        raise MutantDoesNotApply(f"mutant {m.name} no longer applies: {m.path} does not exist")
    text = path.read_text()
    count = text.count(m.find)
    if count != 1:
        raise MutantDoesNotApply(
            f"mutant {m.name} no longer applies: {m.path} holds its search string {count} times, "
            f"not once: {m.find!r}"
        )
    return text, text.replace(m.find, m.replace)


def _scratch_copy() -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    scratch = Path(tempfile.mkdtemp(prefix="entrain-mutants-"))
    for f in filter(None, files):
        src, dst = ROOT / os.fsdecode(f), scratch / os.fsdecode(f)
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return scratch


def _env(scratch: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(scratch), CI="true", PYTHONDONTWRITEBYTECODE="1")


def _pytest(scratch: Path, tests: tuple[str, ...]) -> tuple[int, list[str], float, str]:
    """(exit code, failed node ids, seconds, output tail) of the fast tests ``tests`` in ``scratch``."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-rf",
        "-p",
        "no:cacheprovider",
        "-m",
        "not slow",
        *tests,
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=scratch, env=_env(scratch), capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    out = done.stdout + done.stderr
    failed = re.findall(r"^FAILED (\S+?)(?: - |$)", out, flags=re.MULTILINE)
    return done.returncode, failed, seconds, out[-3000:]


def _check_imports_from(scratch: Path) -> None:
    where = subprocess.run(
        [sys.executable, "-c", "import entrain; print(entrain.__file__)"],
        cwd=scratch,
        env=_env(scratch),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not Path(where).resolve().is_relative_to(scratch.resolve()):
        raise SystemExit(f"the scratch copy imports entrain from {where}, not from {scratch}")


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    )
    return head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def run(mutants: tuple[Mutant, ...]) -> list[dict]:
    for m in mutants:  # all must apply before anything runs
        mutated_text(m, ROOT)
    scratch = _scratch_copy()
    try:
        _check_imports_from(scratch)
        tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
        rc, failed, seconds, tail = _pytest(scratch, tests)
        if rc != 0:
            raise SystemExit(f"the unmutated tree fails its tests ({failed or rc}); fix that first:\n{tail}")
        print(f"unmutated: {len(tests)} test targets pass ({seconds:.0f} s)", flush=True)
        rows = [{"name": "(unmutated)", "killed": False, "failed": [], "seconds": seconds, "rc": rc}]
        for m in mutants:
            original, mutated = mutated_text(m, scratch)
            path = scratch / m.path
            path.write_text(mutated)
            try:
                rc, failed, seconds, tail = _pytest(scratch, m.tests)
            finally:
                path.write_text(original)
            # killed = a test failed (exit 1); a collection error or crash of pytest itself is not a kill
            killed = rc == 1 and bool(failed)
            rows.append({"name": m.name, "killed": killed, "failed": failed, "seconds": seconds, "rc": rc})
            print(f"{m.name}: {'killed by ' + ', '.join(failed) if killed else f'SURVIVED (exit {rc})'}"
                  f" ({seconds:.0f} s)", flush=True)  # fmt: skip
            if not killed and rc != 0:
                print(tail, flush=True)
        return rows
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report(rows: list[dict], mutants: tuple[Mutant, ...]) -> str:
    by_name = {m.name: m for m in mutants}
    killed = sum(r["killed"] for r in rows[1:])
    lines = [
        "# Mutation check",
        "",
        f"`python benchmarks/mutants.py` on {_commit()}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        "Each mutant is applied to a scratch copy of the tree; the listed fast tests run with `-x`.",
        f"The unmutated copy passes those tests ({rows[0]['seconds']:.0f} s).",
        f"**{killed} of {len(rows) - 1} mutants killed.**",
        "",
        "| mutant | edit | file | killed by | s |",
        "|---|---|---|---|---|",
    ]
    for r in rows[1:]:
        m = by_name[r["name"]]
        verdict = (
            ", ".join(f"`{t}`" for t in r["failed"])
            if r["killed"]
            else f"**survived** (pytest exit {r['rc']})"
        )
        lines.append(f"| {m.name} | {m.what} | `{m.path}` | {verdict} | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated mutant names")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mutants.md"))
    args = ap.parse_args()
    mutants = MUTANTS
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {m.name for m in MUTANTS})
        if unknown:
            raise SystemExit(f"unknown mutants {unknown}; choose from {', '.join(m.name for m in MUTANTS)}")
        mutants = tuple(m for m in MUTANTS if m.name in names)
    try:
        rows = run(mutants)
    except MutantDoesNotApply as e:
        raise SystemExit(str(e)) from None
    text = report(rows, mutants)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0 if all(r["killed"] for r in rows[1:]) else 1


if __name__ == "__main__":
    sys.exit(main())
