"""Other names of the built-in datasets (the only copy: ``entrain.data.generators`` and the paper's
Table 1 lookup both read it)."""

from __future__ import annotations

__all__ = ["DATASET_ALIASES", "canonical_dataset"]

DATASET_ALIASES: dict[str, str] = {"llava_instruct_150k": "llava150k"}
"""alias -> the built-in dataset's name."""


def canonical_dataset(name: str) -> str:
    """The built-in name behind an alias; any other name unchanged."""
    return DATASET_ALIASES.get(name, name)
