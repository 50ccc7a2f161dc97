"""How big the journeys run: ``ENTRAIN_JOURNEY_SCALE=tiny`` (the default) rewrites the documented
sizes by ``TINY`` and puts tiny stock checkpoints at the documented model folders; ``=full`` runs
every command at its documented size, with the model folders taken from ``$ENTRAIN_JOURNEY_MODELS``
(the folder holding ``ckpt/qwen25vl-3b``, ``ckpt/llama32-1b``, ``Qwen2.5-VL-3B-Instruct/``,
``ckpt/qwen3vl-8b``).
docs/journeys.md describes both."""

from __future__ import annotations

import os
from dataclasses import dataclass

SCALE_ENV = "ENTRAIN_JOURNEY_SCALE"
MODELS_ENV = "ENTRAIN_JOURNEY_MODELS"


@dataclass(frozen=True)
class Reduction:
    subcommand: str
    flag: str
    value: str | None
    """None: a switch (``--quick``)."""
    when: str = ""
    """A word the command line must hold (``--out``), ``!WORD``: must not hold; empty: always."""
    add: bool = False
    """Add the flag when the line lacks it (else only a value the line gives is replaced)."""


TINY = (
    Reduction("data synth", "--num-samples", "8"),  # 8 records: 2 steps of global batch 4
    Reduction("data stats", "--num-samples", "8"),
    Reduction("train", "--steps", "2"),
    Reduction("train", "--steps", "2", "--demo", add=True),  # the demo's 8 steps
    Reduction("train", "--global-batch", "4", "!--plan", add=True),  # the default 16 (a plan's is its own)
    Reduction("plan", "--gpus", "2", "--out"),  # a plan for train: its ranks are 2 forked processes
    Reduction("plan", "--global-batch", "4", "--out"),
    Reduction("plan", "--global-batch", "32", "!--out", add=True),  # Alg. 1 stops at the global batch
    Reduction("simulate", "--global-batch", "32", add=True),
    Reduction("simulate", "--iterations", "1", add=True),
    Reduction("assign", "--global-batch", "32"),
    Reduction("bench paper", "--quick", None, add=True),  # one case, two iterations (its own flag)
    Reduction("profile", "--tokens", "16,64", "!--from-trace", add=True),  # two sizes fit a line
    Reduction("profile", "--repeats", "1", "!--from-trace", add=True),
    Reduction("profile", "--warmup", "0", "!--from-trace", add=True),
)
"""The documented sizes a 2-core CI run cannot afford, and what they become. ``--gpus`` of a plan
that is only simulated stays as written (64 simulated GPUs cost no more than 8)."""

STOCK_FOLDERS = {
    "ckpt/qwen25vl-3b": "qwen2_5_vl",
    "ckpt/llama32-1b": "llama",
    "Qwen2.5-VL-3B-Instruct": "qwen2_5_vl",
    "ckpt/qwen3vl-8b": "qwen3_vl",
}
"""The documented model folders (downloaded outside) -> the tiny checkpoint put there at ``tiny``
scale (tests/journeys/conftest.py ``stock_folders``): a whole Qwen2.5-VL with its tokenizer serves
as ``--model-path`` and as ``--vision-model`` (its merger projects to the Llama's 64 features)."""


def scale() -> str:
    value = os.environ.get(SCALE_ENV, "tiny")
    if value not in ("tiny", "full"):
        raise ValueError(f"{SCALE_ENV}={value!r}: tiny or full")
    return value


def _applies(rule: Reduction, subcommand: str, argv: list[str]) -> bool:
    if rule.subcommand != subcommand:
        return False
    if rule.when.startswith("!"):
        return rule.when[1:] not in argv
    return not rule.when or rule.when in argv


def reduced(subcommand: str, argv: list[str]) -> list[str]:
    """``argv`` with ``TINY``'s sizes at ``tiny`` scale (unchanged at ``full``)."""
    if scale() == "full":
        return list(argv)
    out = list(argv)
    for rule in TINY:
        if not _applies(rule, subcommand, argv):
            continue
        if rule.flag in out:
            if rule.value is not None:
                out[out.index(rule.flag) + 1] = rule.value
        elif rule.add:
            out += [rule.flag] if rule.value is None else [rule.flag, rule.value]
    return out
