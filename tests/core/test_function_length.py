"""No function in ``entrain/core`` or ``entrain/sim`` is longer than 80 lines (issue 23: one concern
per function; the planning package was split by concern)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_function_length import long_functions

PACKAGE = Path(__file__).resolve().parents[2] / "entrain"
MAX_LINES = 80
ALLOWED: dict[str, str] = {}
"""Files allowed a longer function, with the reason (none today)."""


@pytest.mark.parametrize("layer", ["core", "sim"])
def test_core_and_sim_functions_are_short(layer):
    found = long_functions(PACKAGE / layer, MAX_LINES)
    assert [f for f in found if f.partition(":")[0] not in ALLOWED] == []
