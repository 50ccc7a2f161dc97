"""Flag values checked at parse time, in one table (docs/contract.md, general rules: a bad flag value,
a missing or malformed input file, or an output path that cannot be written is one line on stderr,
``entrain <command>: error: ...``, exit status 2, before any work starts).

``RULES`` maps a flag's destination name to its check, for every command that has the flag;
``PER_COMMAND`` overrides it where a command gives the flag another meaning (``--out`` is a file for
``profile`` and ``bench paper``, a folder for ``train``, ``data synth`` and ``export``).
``apply_rules`` installs the checks as the flags' argparse ``type`` after the parsers are built;
``check_args`` runs the checks that need several flags (the memory a run's samples would take).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from entrain.core.errors import ConfigError
from entrain.core.files import file_problem, printable

__all__ = ["PER_COMMAND", "RULES", "EntrainParser", "apply_rules", "check_args"]


class EntrainParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``entrain <command>: error: ...`` (exit 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {printable(message)}\n")


@dataclass(frozen=True)
class Number:
    """A number in ``[low, high]`` (``low_open``: ``> low``); ``kind`` int or float; finite."""

    kind: type = int
    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def __call__(self, text: str):
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self._noun()}, got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        if too_low or (self.high is not None and value > self.high):
            raise argparse.ArgumentTypeError(f"must be {self._range()}, got {text}")
        return value

    def _noun(self) -> str:
        return "an integer" if self.kind is int else "a number"

    def _range(self) -> str:
        low = (
            None
            if self.low is None
            else (f"> {self._num(self.low)}" if self.low_open else f">= {self._num(self.low)}")
        )
        high = None if self.high is None else f"<= {self._num(self.high)}"
        return " and ".join(x for x in (low, high) if x)

    def _num(self, x: float) -> str:
        return str(int(x)) if self.kind is int else f"{x:g}"


MAX_COUNT = 1 << 24
"""Upper bound of every count flag (samples, steps, GPUs ...): larger is a typo, not a run."""

POSITIVE = Number(int, 1, MAX_COUNT)
NON_NEGATIVE = Number(int, 0, MAX_COUNT)
SEED = Number(int, 0, 2**32 - 1)
MAX_FLOAT = 1e9
"""Upper bound of the times and factors (seconds, norms, budget factors)."""
POSITIVE_FLOAT = Number(float, 0.0, MAX_FLOAT, low_open=True)
NON_NEGATIVE_FLOAT = Number(float, 0.0, MAX_FLOAT)
RATE = Number(float, 0.0, 10.0)
"""A learning rate; 0 trains nothing and keeps every weight bitwise (checks of loading and export)."""
DECAY = Number(float, 0.0, 10.0)
PROBABILITY = Number(float, 0.0, 1.0, low_open=True)


def systems_list(text: str) -> str:
    """A comma list of known system names, at least one (the text is kept as given)."""
    from entrain.core.systems import parse_systems

    try:
        parse_systems(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def profile_file(text: str) -> str:
    """A readable profile / cost-model JSON (``entrain profile``'s output)."""
    from entrain.core.costs.costmodel import CostModel

    try:
        CostModel.load(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def existing_file(text: str) -> str:
    problem = file_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return text


def existing_dir(text: str) -> str:
    if not os.path.isdir(text):
        why = "not a folder" if os.path.exists(text) else "no such folder"
        raise argparse.ArgumentTypeError(f"{text}: {why}")
    return text


def weights_dir(text: str) -> str:
    """An existing weights folder whose ``.safetensors`` files (its own, ``vision/`` and ``llm/``) are
    whole: a file cut off is named here, not by every rank after the processes start."""
    from entrain.core.safetensors_header import safetensors_files, safetensors_problem

    existing_dir(text)
    for path in safetensors_files(text):
        problem = safetensors_problem(path)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{path}: {problem}")
    return text


def existing_path(text: str) -> str:
    if os.path.isdir(text):
        return text
    return existing_file(text)


def _probe(folder: Path) -> str | None:
    """Why no file can be created in the existing ``folder``; None if one can. A real try (a temporary
    file, removed): permission bits do not tell, for root, a read-only mount or a virtual one (/proc)."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".entrain-probe-")
    except OSError as e:
        return f"{folder} is not writable ({e.strerror or type(e).__name__})"
    os.close(fd)
    os.unlink(name)
    return None


def _unwritable(path: Path, want_dir: bool) -> str | None:
    """Why ``path`` cannot be written as a file (``want_dir`` False) or a folder; None if it can."""
    if path.exists():
        if want_dir and not path.is_dir():
            return "exists and is not a folder"
        if not want_dir and path.is_dir():
            return "is a folder, not a file"
        return _probe(path if want_dir else path.parent)
    ancestor = path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is not a folder"
    return _probe(ancestor)


RUN_FILES = ("plan.json", "trace.json", "tensorboard", "skipped.jsonl")
"""What ``entrain train`` keeps in its run folder besides ``RUN_MARKERS`` (config.json, metrics.jsonl,
checkpoints/): the plan it ran, its trace, TensorBoard events and the records it skipped."""


def is_run_folder(folder: Path) -> bool:
    """Whether ``folder`` holds an ``entrain train`` run: ``checkpoints/``, ``metrics.jsonl`` or a run's
    ``config.json`` (one with the run's ``flags`` and ``fingerprint``, not a model's)."""
    if (folder / "checkpoints").is_dir() or (folder / "metrics.jsonl").is_file():
        return True
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "flags" in config and "fingerprint" in config


def run_conflict(path: Path, want_dir: bool, owned: bool = False) -> str | None:
    """Why writing ``path`` would harm a training run it does not own; None if it would not. A file may
    be added beside a run's own files (``plot-trace RUN --out RUN/gantt.png``), never over them or
    inside its checkpoints; an output folder (replaced whole by ``--overwrite``) is never a run folder
    or inside one; a run folder the command ``owned`` (``entrain train --out``) may be a run, never
    inside another run's files."""
    from entrain.runtime.run_folder import RUN_MARKERS

    whole = want_dir and not owned
    for folder in (path, *path.parents) if whole else path.parents:
        if not is_run_folder(folder):
            continue
        if folder == path:
            return f"would overwrite the run folder {path}; write into another folder"
        entry = path.relative_to(folder).parts[0]
        if whole or entry in (*RUN_MARKERS, *RUN_FILES):
            return f"it is inside the run folder {folder} ({entry}); write outside it"
    return None


def _output(text: str, want_dir: bool, owned: bool = False) -> str:
    """``text`` when it can be written as a file or folder (which ``want_dir`` says) without touching a
    training run it does not own (``run_conflict``; ``owned``: the run folder the command writes)."""
    path = Path(text).absolute()
    why = _unwritable(path, want_dir) or run_conflict(path, want_dir, owned)
    if why is not None:
        raise argparse.ArgumentTypeError(f"cannot write {'into ' if want_dir else ''}{text}: {why}")
    return text


def output_file(text: str) -> str:
    """A file path that can be written (its folder exists or can be made; ``check_output_paths`` makes
    it before the command runs), not over a training run's files."""
    return _output(text, want_dir=False)


def output_dir(text: str) -> str:
    """A folder path that can be written into (exists, or can be made), not a training run or inside one."""
    return _output(text, want_dir=True)


def run_dir_out(text: str) -> str:
    """``entrain train --out``: the run folder the command owns (``--resume`` continues it), never
    inside another run's files."""
    return _output(text, want_dir=True, owned=True)


def _image_formats() -> dict[str, str]:
    """File extension -> format name of the images matplotlib can write."""
    from matplotlib.backend_bases import FigureCanvasBase

    return FigureCanvasBase.get_supported_filetypes()


def image_file(text: str) -> str:
    """An image path that can be written, in a format its extension names (none: PNG)."""
    output_file(text)
    suffix = Path(text).suffix.lower().lstrip(".")
    formats = _image_formats()
    if suffix and suffix not in formats:
        raise argparse.ArgumentTypeError(
            f"{text}: .{suffix} is not an image format; use one of {', '.join('.' + f for f in sorted(formats))}"
        )
    return text


Check = Callable[[str], object]

RULES: dict[str, Check] = {
    # counts
    **dict.fromkeys(
        (
            "global_batch",
            "microbatch_size",
            "iterations",
            "steps",
            "gpus",
            "num_samples",
            "encoder_stages",
            "llm_stages",
            "dp",
            "tp",
            "n0",
            "repeats",
            "jobs",
            "nproc",
            "sweep_iterations",
            "keep_checkpoints",
            "val_batches",
            "max_tokens",
            "min_pixels",
            "max_pixels",
        ),
        POSITIVE,
    ),  # fmt: skip
    **dict.fromkeys(("cp", "warmup_steps", "val_every", "checkpoint_every", "warmup", "step"), NON_NEGATIVE),
    "seed": SEED,
    # rates, times, factors
    "lr": RATE,
    "weight_decay": DECAY,
    **dict.fromkeys(("timeout_s", "budget_s", "eager_budget_factor"), POSITIVE_FLOAT),
    "max_grad_norm": NON_NEGATIVE_FLOAT,
    **dict.fromkeys(("alpha", "p_error"), PROBABILITY),
    # names, inputs, outputs
    **dict.fromkeys(("systems", "system"), systems_list),
    "profile": profile_file,
    "image_root": existing_dir,
    "tokenizer": existing_path,
    **dict.fromkeys(("weights", "vision_model", "llm_model"), weights_dir),
    **dict.fromkeys(("plan", "config"), existing_file),
    "plot": image_file,
    "plot_dir": output_dir,
    "out": output_file,
}

PER_COMMAND: dict[tuple[str, str], Check] = {
    ("entrain train", "out"): run_dir_out,
    ("entrain train", "cp"): POSITIVE,
    ("entrain data synth", "out"): output_dir,
    ("entrain export", "out"): output_dir,
    ("entrain plot-trace", "out"): image_file,
    ("entrain export", "run_dir"): existing_dir,
}


OUTPUT_CHECKS: tuple[Check, ...] = (output_file, output_dir, image_file, run_dir_out)
"""The checks of the flags that name a file or folder a command writes (in ``RULES`` / ``PER_COMMAND``:
the one list of output flags; every such flag is probed at parse time and ``check_output_paths``
makes its folder and keeps it out of the base checkpoints)."""
OUTPUT_DESTS = frozenset(
    dest
    for dest, check in (*RULES.items(), *((d, c) for (_, d), c in PER_COMMAND.items()))
    if check in OUTPUT_CHECKS
)
BASE_CHECKPOINT_FLAGS = ("model_path", "weights", "vision_model", "llm_model")
"""The flags naming a checkpoint folder a command reads its model from (never written into)."""


def _typed(check: Check, base) -> Check:
    """``check`` applied after the flag's own ``type`` (kept when it converts to something else)."""
    if base is None or base in (int, float, str) or isinstance(check, Number):
        return check

    def both(text: str):
        value = base(text)
        check(str(value))
        return value

    both.__name__ = getattr(base, "__name__", "value")
    return both


def apply_rules(parser: argparse.ArgumentParser) -> None:
    """Install ``RULES`` / ``PER_COMMAND`` as the ``type`` of every matching flag of ``parser`` and of
    its subcommands' parsers (recursively)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                apply_rules(sub)
            continue
        check = PER_COMMAND.get((parser.prog, action.dest), RULES.get(action.dest))
        if check is None or action.nargs == 0 or action.choices is not None:
            continue
        action.type = _typed(check, action.type)


BYTES_PER_SAMPLE = 1024
"""Memory a sample takes through loading, costing and assignment (about 400 B measured for the
metadata and per-sample work of 10,240 synthchartnet samples; x2.5 for the planners' copies)."""


def _available_bytes() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_output_paths(args: argparse.Namespace) -> None:
    """Every output flag (``OUTPUT_DESTS``) of the command, before any work: never the base checkpoint
    the command reads (``BASE_CHECKPOINT_FLAGS``), inside it or around it; then its folder is made (the
    parse-time probe accepts one that can be made), so no writer fails on a missing folder."""
    bases = {
        flag: Path(v).resolve()
        for flag in BASE_CHECKPOINT_FLAGS
        if isinstance(v := getattr(args, flag, None), str)
    }
    for dest in sorted(OUTPUT_DESTS):
        value = getattr(args, dest, None)
        if not isinstance(value, str):
            continue
        path, flag = Path(value).resolve(), "--" + dest.replace("_", "-")
        for base_flag, base in bases.items():
            if path == base or base in path.parents or path in base.parents:
                raise ConfigError(
                    f"{flag} {value} would write {'inside' if base in path.parents else 'over'} the base checkpoint "
                    f"--{base_flag.replace('_', '-')} {base}; write outside it"
                )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"{flag} {value}: cannot make its folder {path.parent} ({e.strerror})"
            ) from None


def check_args(args: argparse.Namespace) -> None:
    """Checks over several flags, before any work: the output paths (``check_output_paths``) and a run
    whose samples would not fit in memory."""
    batch = getattr(args, "global_batch", None)
    rounds = getattr(args, "iterations", None) or getattr(args, "steps", None) or 1
    available = _available_bytes()
    if isinstance(batch, int) and available is not None:
        need = batch * rounds * BYTES_PER_SAMPLE
        if need > available:
            raise ConfigError(
                f"--global-batch {batch} x {rounds} iteration(s) needs about {need / 2**30:.1f} GiB for its samples "
                f"and their assignment, more than the {available / 2**30:.1f} GiB of memory available"
            )
    check_output_paths(args)
